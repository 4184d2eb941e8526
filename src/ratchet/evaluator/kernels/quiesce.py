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


# -- the GPU: work another context left queued ---------------------------------------------
# A frozen candidate's processes stop issuing GPU work, but what they queued runs on: a
# helper in another CUDA context (or the child's own side stream it never waited for) can
# queue tens of ms of kernels right before it is frozen, and the trusted baseline timed next
# shares the GPU with them. The evaluator cannot synchronize another context; it can see
# that its own tiny kernel takes far longer than on an idle GPU, and wait.

GPU_MAX_WAIT_S = 1.0
_gpu_idle: dict[str, float] = {}


def _probe_s(torch, device) -> float:
    """Host seconds for one tiny kernel on `device`, launched on an idle stream of ours."""
    x = torch.zeros(1, device=device)
    torch.cuda.synchronize(device)
    start = guard._CLOCK()
    x.add_(1)
    torch.cuda.synchronize(device)
    return guard._CLOCK() - start


def settle_gpu(torch, device, max_wait_s: float = GPU_MAX_WAIT_S) -> tuple[float, bool]:
    """Wait until `device` runs our tiny kernel about as fast as when idle.

    Returns (seconds waited, still busy after `max_wait_s`). The idle figure is the best
    of the first probes on this device (a busy GPU only ever makes a probe slower).
    """
    key = str(device)
    if key not in _gpu_idle:
        _gpu_idle[key] = min(_probe_s(torch, device) for _ in range(5))
    idle = _gpu_idle[key]
    limit = max(4 * idle, idle + 100e-6)
    clock = guard._CLOCK
    start = clock()
    while True:
        probe = _probe_s(torch, device)
        _gpu_idle[key] = min(idle, probe)
        if probe <= limit:
            return clock() - start, False
        if clock() - start >= max_wait_s:
            return clock() - start, True
        time.sleep(0.001)
