"""Early stopping only ever discards (issue 19): an evaluator that knows the incumbent's
per-shape times ($RATCHET_INCUMBENT_EXTRA) stops a clearly slower candidate after a few
shapes; the judge discards it with its own reason code and never keeps it, and the
result is recorded so a resumed study reaches the same verdict."""

from __future__ import annotations

from helpers import SCORE_SOLUTION, config_text, make_repo, ratchet, results_tsv

from ratchet.store.ledger import Ledger

# four "shapes", each taking the score times its size; a stop after three of them
EVALUATOR = """
import solution
from ratchet import stats
incumbent = stats.incumbent_extra()
times = []
for i, size in enumerate((1.0, 2.0, 3.0, 4.0)):
    times.append(1.0 + solution.score() * size)
    known = [incumbent.get(f"shape{j}") for j in range(len(times))]
    if incumbent and stats.clearly_slower(times, known) is not None:
        print("stopped_early: 1")
        break
else:
    for i, t in enumerate(times):
        print(f"shape{i}: {t}")
print(f"score: {solution.score()}")
"""


def test_a_clearly_slower_candidate_is_stopped_and_only_ever_discarded(tmp_path):
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(search="[search]\nproposer = \"tune\"\nparallel = 2\n"
                                           "rounds = 4\n"),
        "evaluate.py": EVALUATOR, "solution.py": SCORE_SOLUTION})
    run = ratchet(repo, "run")
    assert run.returncode == 0, run.stderr
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    cands = ledger.candidates()
    stopped = [c for c in cands if (c.extra or {}).get("stopped_early")]
    assert stopped, [(c.id, c.status, c.metric) for c in cands]
    for cand in stopped:
        assert cand.status == "discard" and cand.code == "stopped-early", cand
        assert "stopped early" in cand.reasons
    # nothing that was stopped would have been kept: each was worse than the incumbent
    # it ran against (the kept scores only go down)
    keeps = [c for c in cands if c.status == "keep"]
    for cand in stopped:
        before = [k.metric for k in keeps if k.seq < cand.seq]
        assert cand.metric > min(before)
    # a stopped run measures nothing: it joins no commit's pooled estimate
    groups = ledger.evaluations()
    assert all(c.commit_sha not in groups for c in stopped)
    # the verdicts are recorded: a resumed (finished) study reaches the same ones
    assert ratchet(repo, "run").returncode == 0
    again = Ledger(repo / ".ratchet" / "ledger.db")
    assert [(c.id, c.status, c.code) for c in again.candidates()] == [
        (c.id, c.status, c.code) for c in cands]
    again.close()
    ledger.close()


# a training run: its loss falls with the step, scaled by the knob (X = 3 is twice as bad
# as X = 1 at every step); it reports each step on the progress pipe, slowly
TRAIN = """
import os, time
X = 1.0
fd = int(os.environ.get("RATCHET_PROGRESS_FD", "-1"))
loss = None
for step in range(40):
    loss = (1.0 + X) / (1.0 + 0.1 * step)
    if fd >= 0:
        os.write(fd, f"{step} {loss}\\n".encode())
    time.sleep(0.05)
with open("final.txt", "w") as fh:
    fh.write(str(loss))
"""
TRAIN_EVALUATOR = 'print(f"score: {float(open(\'final.txt\').read())}")\n'


def test_a_training_run_clearly_worse_than_the_incumbents_is_stopped_early(tmp_path):
    task = ('[task]\nname = "train"\neditable = ["train.py"]\nprotected = ["evaluate.py"]\n'
            'run = "python train.py"\nevaluate = "python evaluate.py"\ntimeout = "60s"\n')
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(
            task=task, search='[search]\nproposer = "tune"\nparallel = 1\nrounds = 4\n',
            knobs='[tune.knobs]\n"train.py:X" = { choices = [3.0, 1.0, 0.5, 2.0] }\n'),
        "evaluate.py": TRAIN_EVALUATOR, "train.py": TRAIN})
    run = ratchet(repo, "run")
    assert run.returncode == 0, run.stderr
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    rows = ledger.candidates()
    baseline = rows[0]
    assert len((baseline.result or {}).get("progress") or []) == 40  # its curve, recorded
    full = next(p["seconds"] for p in baseline.result["phases"] if p["name"] == "run")
    incumbent_x = 1.0
    seen = {"stopped": 0, "ran": 0}
    for cand in rows[1:]:
        x = float(cand.params["train.py:X"])
        stopped = bool((cand.extra or {}).get("stopped_early"))
        if x > incumbent_x:  # clearly worse at every step: stopped, and only discarded
            assert stopped, (cand.id, x, cand.status, cand.reasons)
            assert cand.status == "discard" and cand.code == "stopped-early"
            assert "run stopped at " in cand.reasons and " on its progress axis: " in \
                cand.reasons
            step = cand.extra["stopped_at_step"]
            assert 8 <= step < 39  # past the first fifth of the run, well before its end
            ran = next(p["seconds"] for p in cand.result["phases"] if p["name"] == "run")
            assert ran < full
            assert "evaluate" not in [p["name"] for p in cand.result["phases"]]
            seen["stopped"] += 1
        else:  # as good or better: run to the end and evaluated
            assert not stopped, (cand.id, x, cand.reasons)
            assert cand.metric is not None
            seen["ran"] += 1
        if cand.status == "keep":
            incumbent_x = x
    assert seen["stopped"] and seen["ran"], seen
    # results.tsv: a stopped run is blank and says so with its numbers, never a 0 (its
    # point is the run's own progress axis, a step here, seconds for tinygpt)
    tsv = {r["commit"]: r for r in results_tsv(repo)}
    for cand in rows[1:]:
        if (cand.extra or {}).get("stopped_early"):
            row = tsv[cand.short]
            assert row["score"] == "" and row["evals"] == "0", row
            x = cand.extra["stopped_at_step"]
            assert row["description"].endswith(
                f"[stopped early: clearly worse than the incumbent at the same point of the "
                f"run ({cand.extra['stopped_value']:.4g} vs "
                f"{cand.extra['incumbent_value']:.4g} at {x:g})]"), row
    # recorded in the ledger: a resumed (finished) study reads the same verdicts
    assert ratchet(repo, "run").returncode == 0
    again = Ledger(repo / ".ratchet" / "ledger.db")
    assert [(c.id, c.status, c.code) for c in again.candidates()] == [
        (c.id, c.status, c.code) for c in rows]
    again.close()
    ledger.close()
