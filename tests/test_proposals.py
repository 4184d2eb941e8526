"""Pure pieces of scheduling: throughput figures from the ledger, re-basing proposals
made ahead of time onto a moved incumbent (real git), the view a round is proposed from."""

from __future__ import annotations

import pytest
from helpers import git, make_repo

from ratchet.core.candidate import Candidate, Proposal
from ratchet.driver.candidate import rebase
from ratchet.driver.settle import without_verdict
from ratchet.job import gitrepo
from ratchet.store.ledger import throughput


def cand(i: int, start: float, run: float, queue: float = 0.0) -> Candidate:
    return Candidate(id=f"c{i:04d}", seq=i, round=1, status="discard", run_s=run,
                     submitted_at=start, finished_at=start + queue + run)


def test_throughput_duty_and_limit():
    # two slots, four 3 s jobs back to back: fully busy for 6 s
    cands = [cand(0, 0, 3), cand(1, 0, 3), cand(2, 3, 3), cand(3, 3, 3)]
    t = throughput(cands, slots=2)
    assert t.jobs == 4 and t.wall_s == 6 and t.busy_s == 12
    assert t.duty == 1.0
    assert t.limit_per_hour == pytest.approx(2 * 3600 / 3)
    assert t.per_hour == pytest.approx(4 * 3600 / 6)
    # one slot idles half the time: duty 0.75
    half = throughput([cand(0, 0, 6), cand(1, 0, 3)], slots=2)
    assert half.duty == 0.75
    assert throughput([], slots=2).duty is None


def test_rebase_carries_a_change_onto_a_moved_incumbent(tmp_path):
    repo = make_repo(tmp_path / "r", {"a.py": "A = 1\n", "b.py": "B = 1\n"})
    old = git(repo, "rev-parse", "HEAD")
    new = gitrepo.commit_files(repo, old, {"a.py": b"A = 2\n"}, "keep: A = 2")
    moved = rebase(repo, Proposal(description="B = 5", files={"b.py": b"B = 5\n"}), old, new)
    assert moved is not None and moved.commit
    assert git(repo, "rev-parse", f"{moved.commit}^") == new
    assert git(repo, "show", f"{moved.commit}:a.py") == "A = 2"
    assert git(repo, "show", f"{moved.commit}:b.py") == "B = 5"
    # the same line changed both ways: dropped (the proposer is asked again)
    assert rebase(repo, Proposal(description="A = 7", files={"a.py": b"A = 7\n"}),
                  old, new) is None
    # nothing moved: the proposal is used as made
    same = Proposal(description="x", files={"b.py": b"B = 9\n"})
    assert rebase(repo, same, old, old) is same


def test_a_round_is_proposed_from_the_previous_round_in_flight():
    judged = Candidate(id="c0001", seq=1, round=1, status="keep", metric=1.5, gain=0.5,
                       reasons="better", params={"X": 1}, judged_at=5.0, samples=[1.5])
    seen = without_verdict(judged)
    assert seen.status == "submitted" and not seen.is_judged
    assert seen.metric is None and seen.reasons is None and seen.judged_at is None
    assert seen.params == {"X": 1}  # what was tried stays visible (no duplicates)


def test_a_knob_setting_made_ahead_is_reapplied_on_the_moved_incumbent(tmp_path):
    from helpers import config_text

    from ratchet.driver.config import load_config
    from ratchet.driver.proposals import Proposals
    from ratchet.store.ledger import Ledger

    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(),
        "solution.py": "X = 3.0\nY = 1\n",
        "evaluate.py": "print('score: 1')\n"})
    old = git(repo, "rev-parse", "HEAD")
    new = gitrepo.commit_files(repo, old, {"solution.py": b"X = 1.5\nY = 2\n"}, "keep")
    ledger = Ledger(tmp_path / "ledger.db")
    proposals = Proposals(repo, tmp_path, load_config(repo), ledger, "tune")
    try:
        made = Proposal(description="tune: X=0.0", files={"solution.py": b"X = 0.0\nY = 1\n"},
                        params={"solution.py:X": 0.0})
        moved, conflicting = proposals.on(old, new, [made])
        assert conflicting == [] and len(moved) == 1
        # the setting is applied to the new incumbent's file: Y = 2 of the keep survives
        assert moved[0].files["solution.py"] == b"X = 0.0\nY = 2\n"
        # a free-form edit of the same line cannot be carried: it is handed back
        edit = Proposal(description="edit", files={"solution.py": b"X = 9.0\nY = 1\n"})
        assert proposals.on(old, new, [edit]) == ([], [edit])
    finally:
        proposals.close()
        ledger.close()


def test_ideas_of_proposals_not_yet_recorded_are_not_handed_out_again(tmp_path):
    """A second ask in the same round (after conflicts) or the next rolling ask while
    made proposals wait: the ideas those proposals carry are still pending in the ledger,
    and the proposer must not get them again (one idea ran twice in a round)."""
    from helpers import config_text

    from ratchet.driver.config import load_config
    from ratchet.driver.proposals import Proposals
    from ratchet.store.ledger import Ledger

    repo = make_repo(tmp_path / "r", {"ratchet.toml": config_text(), "solution.py": "X = 1\n",
                                      "evaluate.py": "print('score: 1')\n"})
    ledger = Ledger(tmp_path / "ledger.db")
    for idea in ("fuse the loops", "unroll by 4", "use a lookup table"):
        ledger.add_idea(idea)
    proposals = Proposals(repo, tmp_path, load_config(repo), ledger, "tune")
    try:
        head = git(repo, "rev-parse", "HEAD")
        made = [Proposal(description="fused", files={"solution.py": b"X = 2\n"},
                         idea="fuse the loops"),
                Proposal(description="a free one", files={"solution.py": b"X = 3\n"})]
        ctx = proposals.context(2, head, [], None, taken=made)
        assert ctx.ideas == ["unroll by 4", "use a lookup table"]
        assert proposals.context(2, head, [], None).ideas == [
            "fuse the loops", "unroll by 4", "use a lookup table"]
    finally:
        proposals.close()
        ledger.close()
