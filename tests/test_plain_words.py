"""Plain words (issue 36): what `ratchet run`, `show`, `logs`, `status` and the report say,
as a user reads them.

- under each verdict, why in plain words ("not kept: 178% worse than the incumbent"),
  the judge's numbers kept in `ratchet show`; every line of a run's stdout within 80
  columns;
- the noise in the metric's units; no `-0.00% (better)` when nothing was kept;
- a failure's reason cut keeping the exception, and a ModuleNotFoundError under
  `python -P` naming the cause and the fix;
- `show` says a timed-out phase was killed, never `exit None`;
- `logs` without the worker's sealed JSON and its MAC;
- a budget stop said once, a `wall = "3s"` limit read back as seconds.
"""

from __future__ import annotations

import re

import pytest
from helpers import SCORE_SOLUTION, config_text, make_repo, ratchet, results_tsv, score_repo

from ratchet.core.candidate import Candidate
from ratchet.core.verdict import Reason
from ratchet.driver import words


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    repo = score_repo(tmp_path_factory.mktemp("words") / "r")
    run = ratchet(repo, "run")
    assert run.returncode == 0, run.stderr
    return repo, run


def test_each_verdict_says_why_in_plain_words_within_80_columns(study):
    repo, run = study
    lines = run.stdout.splitlines()
    # X=0.0 scores 1.5625 against the incumbent X=2.0's 0.5625: 178% worse
    at = lines.index("  c0003 discard   score 1.5625       tune: X=0.0")
    assert lines[at + 1].strip() == "not kept: 178% worse than the incumbent"
    kept = lines.index("  c0001 keep      score 0.5625       tune: X=2.0")
    assert lines[kept + 1].strip() == "kept: 81.6% better than the incumbent"
    assert all(len(line) <= 80 for line in lines), [x for x in lines if len(x) > 80]
    keep_lines = [line for line in run.stderr.splitlines() if line.startswith("keep ")]
    assert keep_lines and all(len(line) <= 80 for line in keep_lines), keep_lines
    assert "  confirmed on 2 fresh pairs (`ratchet show c0001`)" in run.stderr.splitlines()
    # the numbers behind the words are one `ratchet show` away
    shown = ratchet(repo, "show", "c0003").stdout.splitlines()
    assert "status discard: no improvement (score 1.5625 vs 0.5625)" in shown
    assert "verdict: not kept: 178% worse than the incumbent" in shown
    kept_shown = ratchet(repo, "show", "c0001").stdout
    # a deterministic score, short of repeats at the first pair: the second look's pair
    # brings them to four, all identical, and the verdict says why it was enough
    assert ("confirmed on 2 fresh pairs: the metric is noiseless (4 repeated evaluations "
            "in the study, all identical), and the pairs reproduced both values") in kept_shown
    assert "estimate: score 0.5625 ± 0 (n=4), every evaluation of its commit pooled" in kept_shown


def test_logs_show_the_phases_not_the_workers_sealed_result(study):
    repo, _ = study
    logs = ratchet(repo, "logs", "c0001")
    assert logs.returncode == 0
    assert "RATCHET-WORKER-RESULT" not in logs.stdout and '"mac"' not in logs.stdout
    assert "score: 0.562500" in logs.stdout  # the evaluator's own output stays
    assert "(the worker reported its result: `ratchet show c0001`)" in logs.stdout


def test_words_for_a_gain_within_the_noise_and_below_min_improvement():
    # the judge's numbers for a 1.2% gain on a 100 ms incumbent, the noise 2.1 ms
    noisy = Candidate(id="c0007", seq=7, round=2, status="discard", metric=98.8, gain=1.2,
                      margin=2.1, noise=2.1, code=Reason.WITHIN_MARGIN,
                      reasons="gain 1.2 within margin 2.1 (the noise)")
    assert words.verdict(noisy, "minimize") == \
        "not kept: the gain (1.2%) is within the noise (±2.1%)"
    small = Candidate(id="c0008", seq=8, round=2, status="discard", metric=101.0, gain=1.0,
                      margin=2.0, noise=None, code=Reason.WITHIN_MARGIN,
                      reasons="gain 1 within margin 2 (min_improvement)")
    assert words.verdict(small, "maximize") == \
        "not kept: the gain (1%) is below min_improvement (2%)"


def test_nothing_kept_reads_so(tmp_path):
    knobs = '[tune.knobs]\n"solution.py:X" = { choices = [5.0, 6.0] }\n'
    repo = score_repo(tmp_path / "r", knobs=knobs,
                      search='[search]\nproposer = "tune"\nparallel = 2\nrounds = 2\n')
    run = ratchet(repo, "run")
    assert run.returncode == 0, run.stderr
    assert any(line.endswith(", nothing kept yet") for line in run.stdout.splitlines())
    assert ", nothing kept yet" in ratchet(repo, "status").stdout
    assert ratchet(repo, "report").returncode == 0
    index = (repo / ".ratchet" / "report" / "index.html").read_text()
    assert "nothing kept yet" in index and "-0.00%" not in index


def test_the_noise_is_given_in_the_metrics_units_and_as_a_share(study):
    repo, _ = study
    assert ratchet(repo, "report").returncode == 0
    index = (repo / ".ratchet" / "report" / "index.html").read_text()
    # score is positive: its noise is pooled relative to the value (a noiseless metric)
    assert ("σ 0% of the value (≈ 0 score at the incumbent), relative (repeated "
            "measurements)") in index
    assert ("  noise of one evaluation: σ 0% of the value (≈ 0 score at the incumbent), "
            "relative (repeated measurements)") in ratchet(repo, "status").stdout.splitlines()


def test_an_import_under_python_P_names_the_cause_and_the_fix(tmp_path):
    config = config_text().replace('evaluate = "python evaluate.py"',
                                   'evaluate = "python -P evaluate.py"')
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config, "solution.py": SCORE_SOLUTION,
        # a newcomer's natural evaluator: it imports the candidate's module
        "evaluate.py": "from solution import score\nprint(f'score: {score()}')\n"})
    run = ratchet(repo, "run", "--rounds", "1")
    assert run.returncode == 2  # the baseline itself fails: nothing can be compared
    lines = run.stdout.splitlines()
    # the reason keeps its end: the exception, not the traceback's `File "..."`
    assert "          baseline failed: … ModuleNotFoundError: No module named 'solution'" \
        in lines, lines
    hint = next(line for line in lines if line.startswith("hint: "))
    assert "no module 'solution' because the evaluator runs as `python -P evaluate.py`" \
        in hint
    assert 'CandidateProcess("solution.py")' in hint and "docs/evaluator-imports.md" in hint
    shown = ratchet(repo, "show", "c0000").stdout
    assert hint in shown.splitlines()
    crash = next(r for r in results_tsv(repo) if r["description"].startswith("baseline"))
    assert crash["score"] == "0.000000" and crash["memory_gb"] == "0.0"  # karpathy's crash
    assert crash["description"].endswith("ModuleNotFoundError: No module named 'solution']")


def test_a_timed_out_phase_reads_killed_not_exit_none(tmp_path):
    knobs = '[tune.knobs]\n"solution.py:SLEEP" = { choices = [30.0] }\n'
    repo = score_repo(tmp_path / "r", knobs=knobs,
                      task=config_text().split("[task.metric]")[0].replace(
                          'timeout = "60s"', 'timeout = "3s"'),
                      search='[search]\nproposer = "tune"\nparallel = 2\nrounds = 1\n')
    run = ratchet(repo, "run")
    assert run.returncode == 0, run.stderr
    shown = ratchet(repo, "show", "c0001").stdout
    assert "exit None" not in shown
    assert re.search(r"phase evaluate +killed +[\d.]+s +TIMED OUT", shown), shown


def test_a_budget_stop_is_said_once_and_a_wall_limit_in_seconds(tmp_path):
    solution = SCORE_SOLUTION.replace("SLEEP = 0.0", "SLEEP = 1.0")
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(search='[search]\nproposer = "tune"\nparallel = 2\n'
                                    'rounds = 20\n') + '\n[budget]\nwall = "3s"\n',
        "evaluate.py": "import solution\nprint(f'score: {solution.score():.6f}')\n",
        "solution.py": solution})
    run = ratchet(repo, "run")
    assert run.returncode == 0, run.stderr
    said = [line for line in (run.stdout + run.stderr).splitlines()
            if "stopped at budget.wall" in line]
    assert len(said) == 1, said
    assert re.search(r"stopped at budget.wall: \d+ s spent of 3 s", said[0]), said
