"""Before a timed request: wait until the evaluator's other threads have gone idle.

Thread pools busy-wait after their work, for the next task: torch's OpenMP workers (GNU
libgomp) for a few ms, OpenBLAS's for ~0.1 s. Measured on the 2-core development
machine, such a spinner in the evaluator takes a core from whatever is timed next: a
two-thread torch baseline's OpenMP barriers then wait for a descheduled thread
(torch.softmax 64x512: 0.05 -> 2-8 ms per call), and a candidate's request shares the
machine with the evaluator's leftover spinning. So the harness waits, outside the timed
region, until no other thread of this process is running. A thread still running after
`max_wait_s` is doing work of its own, not spinning: it is left out of later waits.

Linux only (it reads /proc/self/task); elsewhere `settle` returns at once.
"""

from __future__ import annotations

import os
import threading
import time

from . import guard

_TASKS = "/proc/self/task"
MAX_WAIT_S = 0.5  # above OpenBLAS's spin (2^28 cycles: ~0.1-0.3 s)
POLL_S = 2e-4

# Threads found running through a whole wait: working, not spinning; not waited for again.
_working: set[str] = set()


def running_threads() -> list[str]:
    """Ids of this process's threads, other than the caller, that are running (state R)."""
    me = str(threading.get_native_id())
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return []
    _working.intersection_update(tids)  # an ended thread's id may come back for a new one
    running = []
    for tid in tids:
        if tid == me or tid in _working:
            continue
        try:
            with open(f"{_TASKS}/{tid}/stat", "rb") as f:
                state = f.read().rsplit(b")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue  # the thread ended meanwhile
        if state == b"R":
            running.append(tid)
    return running


def settle(max_wait_s: float = MAX_WAIT_S, poll_s: float = POLL_S) -> float:
    """Wait until no other thread of this process runs (at most `max_wait_s`); seconds waited."""
    clock = guard._CLOCK
    start = clock()
    while running := running_threads():
        waited = clock() - start
        if waited >= max_wait_s:
            _working.update(running)
            return waited
        time.sleep(poll_s)
    return clock() - start
