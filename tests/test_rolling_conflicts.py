"""Rolling search never loses a queued change: one that no longer merges onto the
incumbent it would run on is recorded as `rejected` with the reason, not dropped."""

from __future__ import annotations

from helpers import config_text, make_repo, ratchet, solution_branches

from ratchet.store.ledger import Ledger

EVALUATE = '''
from ratchet.evaluator.channel import report
import solution
report({"score": (solution.X - 1.25) ** 2})
'''


def test_a_queued_ref_that_conflicts_with_the_new_incumbent_is_recorded(tmp_path):
    refs = {"x2": "2.0", "x1": "1.0", "x15": "1.5"}  # all three change the same line
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(
            knobs="",
            # one at a time: the next ref is proposed on the incumbent while one runs, and
            # the pairs of a would-be keep leave no slot to run it beside them
            search='[search]\nproposer = "patches"\nmode = "rolling"\nparallel = 1\n'
                   'candidates = 6\n\n[patches]\nrefs = ["x2", "x1", "x15"]\n'),
        "solution.py": "X = 3.0\n",
        "evaluate.py": EVALUATE,
    })
    solution_branches(repo, refs)

    proc = ratchet(repo, "run", timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cands = [c for c in Ledger(repo / ".ratchet" / "ledger.db").candidates()
             if c.kind == "candidate"]
    seen = {c.description.split(":")[0].removeprefix("ref ") for c in cands}
    assert seen == set(refs), [(c.id, c.status, c.description, c.reasons) for c in cands]
    # at most one ref runs on the baseline before the incumbent moves; every other one
    # is measured on the incumbent or rejected with a reason that says why
    for cand in cands:
        if cand.status == "rejected":
            assert "conflicts with the incumbent" in cand.reasons or \
                "does not apply onto the incumbent" in cand.reasons, cand.reasons
        else:
            assert cand.status in ("keep", "discard"), (cand.status, cand.reasons)
    assert any(c.status == "rejected" for c in cands)
    assert any(c.status == "keep" for c in cands)
