"""Fan-out at the limit (issue 11): what the study does around its jobs, seen from outside.

Real studies (local backend, real workers) and real git; nothing of ratchet's is mocked.
"""

from __future__ import annotations

import re

from helpers import score_repo

from ratchet.study import Study


def test_the_keep_line_follows_its_rounds_progress(tmp_path):
    """`ratchet run` prints a judged round's block when the next round's progress comes
    in; the round's `keep` line must come after it, not above it."""
    events: list[tuple[str, object]] = []
    study = Study(score_repo(tmp_path / "r"),
                  progress=lambda p: events.append(("progress", p.round)),
                  log=lambda line: events.append(("log", line)))
    try:
        study.run()
        rounds = {c.id: c.round for c in study.ledger.candidates()}
    finally:
        study.close()
    keeps = [(i, line) for i, (kind, line) in enumerate(events)
             if kind == "log" and str(line).startswith("keep ")]
    assert keeps, events  # X = 3.0 is beaten by some setting in 3 rounds
    for i, line in keeps:
        cand_id = re.match(r"keep (c\d+) ", line).group(1)
        # a progress report of a later round came first: the view printed the block
        assert any(kind == "progress" and value > rounds[cand_id]
                   for kind, value in events[:i]), (line, events[:i])

