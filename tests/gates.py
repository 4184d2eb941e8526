"""Ordering a study's events without racing the clock.

A test that asserts an order of events (this candidate judged before that one ends) used to
get it from sleeps seconds apart, which a loaded machine reorders. Here the evaluations
that must wait are held instead: the test's evaluator waits for a file named `gate` in its
job's tree (`HOLD`, pasted into the evaluator), and a `GateKeeper` thread beside the study
opens each gate once the ledger shows what must come first. The study's processes are
untouched: real workers, real sandboxes; only the order is the test's.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ratchet.core.candidate import Candidate
from ratchet.store.ledger import Ledger

# Pasted into a test's evaluate.py: `hold()` leaves a file `held` in the job's tree (the
# evaluation is running now) and returns once the test opened this job's gate (at most
# `limit` seconds: a test that never opens it fails on its assertions, not a hang).
HOLD = '''
def hold(limit=120.0):
    import os, time
    open("held", "w").close()
    deadline = time.monotonic() + limit
    while not os.path.exists("gate") and time.monotonic() < deadline:
        time.sleep(0.05)
'''


def job_tree(repo: Path, job_id: str) -> Path:
    return repo / ".ratchet" / "jobs" / job_id / "work"


def by_name(cands: list[Candidate]) -> dict[str, Candidate]:
    """A patches study's candidates by their ref's name ("ref fast: ..." -> "fast")."""
    return {c.description.split(":")[0].removeprefix("ref "): c for c in cands}


class GateKeeper(threading.Thread):
    """Opens gates in order: for each (ready, job) step, once `ready(candidates)` holds,
    the gate of job `job(candidates)` (an id, such as "demo-c0002-0"), as soon as its tree
    exists. Stop it with `close()`; `failure` says what it was waiting for if it gave up."""

    def __init__(self, repo: Path,
                 steps: list[tuple[Callable[[dict[str, Candidate]], bool],
                                   Callable[[dict[str, Candidate]], str]]],
                 timeout: float = 240.0) -> None:
        super().__init__(daemon=True, name="gatekeeper")
        self.repo, self.steps, self.timeout = repo, steps, timeout
        self.opened: list[str] = []
        self.failure = ""
        self._done = threading.Event()

    def _candidates(self) -> dict[str, Candidate]:
        path = self.repo / ".ratchet" / "ledger.db"
        if not path.exists():
            return {}
        with contextlib.suppress(Exception):  # mid-write or still being created: ask again
            db = Ledger(path)
            try:
                return by_name(db.candidates())
            finally:
                db.close()
        return {}

    def run(self) -> None:
        deadline = time.monotonic() + self.timeout
        for n, (ready, job) in enumerate(self.steps):
            while not self._done.is_set():
                cands = self._candidates()
                if cands and ready(cands):
                    job_id = job(cands)
                    gate = job_tree(self.repo, job_id) / "gate"
                    if gate.parent.is_dir():
                        gate.touch()
                        self.opened.append(job_id)
                        break
                if time.monotonic() > deadline:
                    self.failure = f"step {n} never became ready"
                    return
                self._done.wait(0.05)

    def close(self) -> None:
        self._done.set()
        self.join(timeout=10)
