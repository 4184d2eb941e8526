"""Early stopping only ever discards (issue 19): an evaluator that knows the incumbent's
per-shape times ($RATCHET_INCUMBENT_EXTRA) stops a clearly slower candidate after a few
shapes; the judge discards it with its own reason code and never keeps it, and the
result is recorded so a resumed study reaches the same verdict."""

from __future__ import annotations

from helpers import SCORE_SOLUTION, config_text, make_repo, ratchet

from ratchet.driver.ledger import Ledger

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
