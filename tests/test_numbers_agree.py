"""One set of numbers everywhere (issue 36): on one real study with a keep, discards, a
run stopped early and a crash, the end of `ratchet run`, `ratchet status` (and `--json`),
progress.png's title and legend, the report and results.tsv count the same candidates
with the same words; results.tsv's metric is each candidate's pooled estimate with its
number of evaluations and interval, crash rows keep karpathy's 0.000000 / 0.0, and a
stopped run never reads as a measured value."""

from __future__ import annotations

import json
import statistics

import pytest
from helpers import SCORE_SOLUTION, config_text, make_repo, ratchet, results_tsv
from test_early_stop import EVALUATOR

from ratchet.driver.tally import Tally
from ratchet.store.ledger import Ledger

KNOBS = ('[tune.knobs]\n"solution.py:X" = { choices = [3.0, 2.0, 1.5, "boom", 1.0, 0.0, '
         '5.0] }\n')


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    repo = make_repo(tmp_path_factory.mktemp("agree") / "r", {
        "ratchet.toml": config_text(knobs=KNOBS, search="[search]\nproposer = \"tune\"\n"
                                    "parallel = 2\nrounds = 4\n"),
        "evaluate.py": EVALUATOR, "solution.py": SCORE_SOLUTION})
    run = ratchet(repo, "run")
    assert run.returncode == 0, run.stderr
    ledger = Ledger.readonly(repo / ".ratchet" / "ledger.db")
    yield repo, run, ledger, Tally.of(ledger)
    ledger.close()


def test_the_study_has_every_kind_of_verdict(study):
    _, _, _, tally = study
    assert tally.kept >= 1 and tally.stopped >= 1 and tally.crashed >= 1, tally
    assert tally.discarded > tally.stopped and tally.remeasures >= 1, tally
    assert tally.candidates == tally.kept + tally.discarded + tally.crashed + tally.rejected


def test_end_line_status_json_report_and_chart_say_the_same_count(study):
    repo, run, ledger, tally = study
    line = tally.line()
    assert line.startswith(f"{tally.candidates} candidates: {tally.kept} kept, "
                           f"{tally.discarded} discarded ({tally.stopped} stopped early), "
                           f"{tally.crashed} crashed, {tally.rejected} rejected (+ the "
                           f"baseline and {tally.remeasures} re-measures)"), line
    apart = f"  + the baseline and {tally.remeasures} re-measures"
    out = run.stdout.splitlines()
    assert out[out.index(f"study demo: {tally.text()}") + 1] == apart, out
    status = ratchet(repo, "status").stdout.splitlines()
    assert status[status.index(tally.text()) + 1] == apart, status
    assert json.loads(ratchet(repo, "status", "--json").stdout)["tally"] == tally.as_dict()
    assert ratchet(repo, "report").returncode == 0
    index = (repo / ".ratchet" / "report" / "index.html").read_text()
    assert f'<p id="tally">{line}</p>' in index

    from ratchet.ui.progress import ledger_figure

    ax = ledger_figure(ledger, "score", "minimize").axes[0]
    assert ax.get_title() == f"{tally.candidates} candidates, {tally.kept} kept"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"kept ({tally.kept})" in legend and "baseline" in legend, legend
    assert f"discarded ({tally.discarded})" in legend, legend
    assert f"of them stopped early, not measured ({tally.stopped})" in legend, legend


def test_results_tsv_rows_are_the_candidates_and_their_pooled_estimates(study):
    repo, _, ledger, tally = study
    rows = results_tsv(repo)
    assert list(rows[0])[:5] == ["commit", "score", "memory_gb", "status", "description"]
    assert list(rows[0])[-3:] == ["evals", "ci95_low", "ci95_high"]  # added at the end
    assert rows[0]["description"] == "baseline"
    by_status = [r["status"] for r in rows[1:]]
    assert len(rows) - 1 == tally.candidates  # none cancelled, none running
    assert (by_status.count("keep"), by_status.count("discard"), by_status.count("crash"),
            by_status.count("rejected")) == (tally.kept, tally.discarded, tally.crashed,
                                             tally.rejected)
    groups = ledger.evaluations()
    cands = {c.short: c for c in ledger.candidates()}
    for row in rows:
        cand = cands[row["commit"]]
        if row["status"] == "crash":  # karpathy's crash row
            assert (row["score"], row["memory_gb"], row["evals"]) == ("0.000000", "0.0", "0")
            assert "TypeError" in row["description"]
        elif "[stopped early:" in row["description"]:  # measured nothing: blank, not 0
            assert row["status"] == "discard" and row["score"] == "" and row["evals"] == "0"
            assert row["ci95_low"] == row["ci95_high"] == ""
        else:  # the pooled estimate of every evaluation of its commit, and how many
            values = groups[cand.commit_sha]
            assert row["score"] == f"{statistics.fmean(values):.6f}"
            assert row["evals"] == str(len(values))
            assert float(row["ci95_low"]) <= float(row["score"]) <= float(row["ci95_high"])
    kept = [r for r in rows[1:] if r["status"] == "keep"]
    assert any(int(r["evals"]) > 1 for r in kept)  # a keep is confirmed: measured again
    status = ratchet(repo, "status").stdout
    for row in kept:  # status shows the same estimate as results.tsv
        cand = cands[row["commit"]]
        shown = next(line for line in status.splitlines() if f" {cand.id} " in line)
        assert f" {float(row['score']):.6g} " in shown, shown
