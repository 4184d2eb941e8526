"""Rolling's budget is a number of candidates that run (issue 23): a proposal that cannot
run is recorded on top, and a proposer that only repeats itself cannot hold a study open."""

from __future__ import annotations

from conftest import ledger_of
from llm_server import Answer
from test_latency import run_study


class Repeating:
    """Every reply is the same change: after the first, each one repeats a tried change."""

    def __call__(self, request) -> Answer:
        return Answer("DESCRIPTION: set VALUE to 8\n\nsolution.py\n<<<<<<< FILE\n"
                      "VALUE = 8\n\n\ndef compute():\n    return VALUE\n>>>>>>> FILE\n")


def test_a_proposer_that_repeats_itself_ends_a_rolling_study(tmp_path):
    """Rolling's budget counts candidates that run; a repeat is recorded `rejected`, with
    why, on top. One that only repeats cannot hold the study open: past as many repeats
    as the budget, no more is asked, and the study says so in one line."""
    repo, proc, _ = run_study(tmp_path, Repeating(), 'mode = "rolling"\ncandidates = 3\n',
                              timeout=240, evaluate_s=0)
    assert proc.returncode == 0, proc.stderr
    ledger = ledger_of(repo)
    cands = [c for c in ledger.candidates() if c.kind == "candidate"]
    ledger.close()
    ran = [c for c in cands if c.job_id is not None]
    unrun = [c for c in cands if c.job_id is None]
    assert len(ran) == 1, [(c.id, c.status, c.reasons) for c in cands]  # the one new change
    assert 1 <= len(unrun) <= 3 and all(c.status == "rejected" and c.reasons for c in unrun)
    assert "3 proposals could not run" in proc.stdout + proc.stderr
