"""Fan-out at the limit (issue 11): what the study does around its jobs, seen from outside.

Real studies (local backend, real workers) and real git; nothing of ratchet's is mocked.
"""

from __future__ import annotations

import re

from helpers import score_repo

from ratchet.driver.study import Study


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



def test_results_are_looked_for_fast_only_around_when_a_job_is_due(tmp_path):
    from ratchet.driver.jobs import FAST_POLL_S, POLL_S, SLOW_POLL_S

    study = Study(score_repo(tmp_path / "r"))
    try:
        jobs = study.jobs

        def pause(*elapsed: float) -> float:
            return jobs.pause([(f"c{i}", "", e, "running: evaluate")
                               for i, e in enumerate(elapsed)])

        assert pause(1.0) == POLL_S  # nothing finished yet: no idea when one is due
        jobs._took.extend([3.0, 3.1, 2.9])  # recent jobs ran 2.9 to 3.1 s
        assert pause(0.5) == SLOW_POLL_S  # long before: a look every 50 ms
        assert FAST_POLL_S < pause(2.78) < SLOW_POLL_S  # just until its window opens
        # from 0.1 s before the shortest to a while after the longest: every 5 ms
        assert pause(2.85) == pause(3.0) == pause(3.35) == FAST_POLL_S
        assert pause(0.5, 2.95) == FAST_POLL_S  # one job in its window is enough
        assert pause(4.5) == POLL_S  # well past it (a slow one): back to the usual pace
        assert pause(0.5, 4.5) == SLOW_POLL_S  # the overdue one alone does not keep it fast
        assert pause() == POLL_S
    finally:
        study.close()


def test_a_study_learns_how_long_its_jobs_take(tmp_path):
    study = Study(score_repo(tmp_path / "r", search='[search]\nproposer = "tune"\n'
                            'parallel = 2\nrounds = 1\n'))
    try:
        study.run()
        took = list(study.jobs._took)
        cands = study.ledger.candidates()
    finally:
        study.close()
    # every finished job's time: the candidates' and any confirmation pairs'
    judged = [c for c in cands if c.status in ("keep", "discard")]
    assert len(judged) == 2 and len(took) >= len(judged)
    assert all(0 < t < 30 for t in took)
