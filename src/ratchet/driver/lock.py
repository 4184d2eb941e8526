"""One driver per study: an flock on .ratchet/lock, so a dead holder never blocks us. And
one submission at a time: an flock on .ratchet/submit.lock, held for a moment."""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from ratchet.core.errors import UserError


class StudyLocked(UserError):
    """Another driver holds the study (the Study front reports it as a StudyError)."""


class StudyLock:
    """One driver per study. The lock is an flock, so a dead holder never blocks us."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh: TextIO | None = None
        self.shared = False

    def share(self) -> None:
        """This process works beside the driver that holds the lock (`ratchet wait`
        while `ratchet run` runs): `acquire` then takes nothing."""
        self.shared = True

    def acquire(self, on_wait: Callable[[str], None] | None = None) -> None:
        """Take the lock, or raise StudyLocked; with `on_wait`, tell it who holds the lock
        and wait for it instead (`ratchet wait` during a `ratchet run`)."""
        if self.shared or self.fh is not None:
            return  # shared with the driver that holds it, or held already by this one
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.path, "a+")  # noqa: SIM115
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            holder = fh.read().strip() or "another process"
            if on_wait is None:
                fh.close()
                raise StudyLocked(
                    f"study is locked by {holder}; wait for it to finish or stop it (Ctrl-C)"
                ) from None
            on_wait(holder)
            fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} on {os.uname().nodename} since {time.ctime()}\n")
        fh.flush()
        self.fh = fh

    def release(self) -> None:
        if self.fh:
            self.fh.close()
            self.fh = None


class SubmitLock:
    """One submission at a time, across processes: `ratchet submit`, any number of
    `ratchet mcp` servers (one per agent) and a `ratchet run` beside them. Held while a
    submission's budget is checked and its row recorded, so a flood from several clients
    cannot pass a `[budget]` limit together, nor a run's predicted candidate ids be taken
    meanwhile. Blocking (a submission takes milliseconds), an flock (a dead holder
    releases it), re-entrant in the thread that holds it, and one thread at a time."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fh: TextIO | None = None
        self.depth = 0
        self._thread = threading.RLock()

    def __enter__(self) -> SubmitLock:
        self._thread.acquire()
        try:
            if self.depth == 0:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                fh = open(self.path, "a+")  # noqa: SIM115
                fcntl.flock(fh, fcntl.LOCK_EX)
                self.fh = fh
        except BaseException:
            self._thread.release()
            raise
        self.depth += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self.depth -= 1
        if self.depth == 0 and self.fh is not None:
            self.fh.close()  # closing the file releases the flock
            self.fh = None
        self._thread.release()
