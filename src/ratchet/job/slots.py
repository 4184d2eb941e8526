"""Slot leasing on one machine: one flock per slot, and a first-come line for waiters.

A lease is an exclusive flock on the slot's lock file, held for as long as the job uses
the slot and released by the kernel even if the worker is SIGKILLed, so a crashed worker
never leaks a slot and a restarted driver sees the same accounting.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from ratchet.job.jobspec import JobSpec, Slot

BLOCKING_WAIT_S = 0.1  # the longest a blocked first-in-line waiter goes without a look


class WaitingLine:
    """First come, first served among the workers waiting for the same slots.

    Each waiter holds an flock on a ticket file named by its arrival time; a ticket whose
    lock can be taken belongs to a waiter that died (the kernel released it) and is
    removed. Without the line, whichever waiter polls first after a release wins, and a
    built candidate can wait several turns while later ones run.
    """

    def __init__(self, lock_dir: Path, kind: str) -> None:
        self.dir = lock_dir / f"line-{kind}"
        self.dir.mkdir(parents=True, exist_ok=True)
        name = f"{time.time_ns():020d}-{os.getpid()}"
        draft = self.dir / f".{name}"
        self.fh = open(draft, "w")  # noqa: SIM115 - held while we wait
        fcntl.flock(self.fh, fcntl.LOCK_EX)
        self.path = self.dir / name
        draft.rename(self.path)  # visible only once locked: never mistaken for a dead one

    def ahead(self) -> int:
        """Live waiters that came before us."""
        count = 0
        for entry in sorted(self.dir.iterdir()):
            if entry.name >= self.path.name:
                break
            if entry.name.startswith("."):
                continue  # a ticket being written: not in line yet
            try:
                with entry.open() as other:
                    try:
                        fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    except BlockingIOError:
                        count += 1  # its waiter is alive
                        continue
                entry.unlink(missing_ok=True)  # a dead waiter's ticket
            except OSError:
                continue  # it left meanwhile
        return count

    def leave(self) -> None:
        self.path.unlink(missing_ok=True)
        self.fh.close()


class _Expired(Exception):
    pass


def _raise_expired(signum, frame) -> None:  # noqa: ARG001
    raise _Expired


def _flock_within(fh: IO, seconds: float) -> bool:
    """An exclusive flock, waited for in the kernel for at most `seconds`: it is handed
    over the moment its holder lets go, where polling would add up to a poll interval to
    every hand-over of a busy slot. Main thread only (the wait is cut by SIGALRM)."""
    previous = signal.signal(signal.SIGALRM, _raise_expired)
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        return True
    except _Expired:
        # an alarm that landed just after the lock was taken: the caller closes the file,
        # which lets the lock go, and tries again
        return False
    finally:
        signal.signal(signal.SIGALRM, previous)


def _try_slot(fh: IO, wait_s: float) -> bool:
    if wait_s > 0:
        return _flock_within(fh, wait_s)
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def lease_slot(spec: JobSpec, slots: list[Slot],
               stopped: Callable[[], bool]) -> tuple[Slot | None, IO | None]:
    """The first free slot of `slots`, waiting in line for one; (None, None) when the job
    has no slots to lease (remote backends) or was stopped while waiting."""
    if not slots or not spec.slot_lock_dir:
        return None, None
    lock_dir = Path(spec.slot_lock_dir)
    lock_dir.mkdir(parents=True, exist_ok=True)
    # one line per kind of slot: gpu0, gpu1 -> "gpu"; build0, build1 -> "build"
    line = WaitingLine(lock_dir, slots[0].name.rstrip("0123456789.") or "slot")
    # one slot (one GPU): the first in line waits on its lock in the kernel, a while at a
    # time so that a stop or a change in the line is still seen; several: poll them all
    wait_s = (BLOCKING_WAIT_S if len(slots) == 1
              and threading.current_thread() is threading.main_thread() else 0.0)
    try:
        while not stopped():
            # only as many waiters as there are slots try at once: the first in line
            ahead = line.ahead()
            if ahead >= len(slots):
                # far back in line: look less often (every look opens the tickets ahead)
                time.sleep(min(0.01 * (ahead - len(slots) + 1), 0.1))
                continue
            for slot in slots:
                fh = open(lock_dir / f"{slot.name}.lock", "a+")  # noqa: SIM115
                if not _try_slot(fh, wait_s):
                    fh.close()
                    continue
                fh.seek(0)
                fh.truncate()
                fh.write(f"{spec.job_id} {os.getpid()}\n")
                fh.flush()
                return slot, fh
            if not wait_s:
                time.sleep(0.01)
    finally:
        line.leave()
    return None, None
