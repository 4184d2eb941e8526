"""A confirmation is write-ahead like every job: a driver killed while a would-be keep is
re-measured resumes on the same pairs and reaches the verdicts an uninterrupted study
reaches (issue 19: what was measured is recorded, so a resumed study does the same)."""

from __future__ import annotations

import pytest
from helpers import ratchet, score_repo

from ratchet.store.ledger import Ledger


def outcome(repo):
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    cands = [(c.id, c.status, c.metric) for c in ledger.candidates()]
    pairs = sorted((r.confirms, r.description, r.status, r.metric)
                   for r in ledger.candidates(confirmations=True) if r.confirms)
    record = ledger.incumbent()
    ledger.close()
    return cands, pairs, (record.commit, record.metric, record.samples)


@pytest.mark.parametrize("point", ["confirm-recorded:1", "confirm-measured:1",
                                   "confirm-measured:2"])
def test_killed_while_confirming_resumes_to_the_same_result(tmp_path, point):
    whole = score_repo(tmp_path / "whole")
    assert ratchet(whole, "run").returncode == 0
    expected = outcome(whole)
    assert expected[1], "the study confirmed at least one keep"

    killed = score_repo(tmp_path / "killed")
    first = ratchet(killed, "run", env={"RATCHET_FAULT": point})
    assert first.returncode != 0  # SIGKILLed at the point
    resumed = ratchet(killed, "run")
    assert resumed.returncode == 0, resumed.stderr
    got = outcome(killed)
    assert got[0] == expected[0]  # every candidate, verdict and measurement
    # the same pairs (a re-measure interrupted by the kill ran again, once)
    assert [(c, d, s) for c, d, s, _ in got[1]] == [(c, d, s) for c, d, s, _ in expected[1]]
    assert got[2][1:] == expected[2][1:]  # the incumbent's pooled record (commits differ)
