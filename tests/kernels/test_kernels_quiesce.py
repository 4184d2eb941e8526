"""quiesce.settle(): before a timed request, the evaluator's own spinning threads go idle first."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import threading
import time

import kernel_cases as kc
import numpy as np
import pytest

from ratchet.evaluator.kernels import compare, quiesce

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="reads /proc (Linux)")


def test_a_thread_that_keeps_working_is_waited_for_once():
    stop = threading.Event()

    data = bytes(1 << 22)

    def work() -> None:  # hashing releases the GIL: the thread runs while the caller waits
        while not stop.is_set():
            hashlib.sha256(data).digest()

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    try:
        first = quiesce.settle(max_wait_s=0.2)
        assert first >= 0.2  # it waited for the running thread, up to the limit
        assert str(worker.native_id) not in quiesce.running_threads()  # now known as working
        assert quiesce.settle(max_wait_s=0.2) < 0.1  # and not waited for again
    finally:
        stop.set()
        worker.join()


SPIN = """
import json, os, time
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
import torch
from ratchet.evaluator.kernels import compare, quiesce
torch.set_num_threads(2)
x = torch.randn(256, 4096)
for _ in range(20):
    torch.softmax(x, -1)
running = quiesce.running_threads()  # OpenMP's worker, spinning for the next region
waited = quiesce.settle()
print(json.dumps({"running": running, "waited": waited, "after": quiesce.running_threads()}))
"""


def test_settle_waits_until_torch_openmp_pool_stops_spinning():
    pytest.importorskip("torch")
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two CPUs")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(SPIN)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["running"]:
        pytest.skip(f"torch's OpenMP pool did not spin here: {got}")
    assert got["after"] == [], got
    assert 0 < got["waited"] < quiesce.MAX_WAIT_S, got  # it went idle by itself: waited, not given up


def test_the_trusted_baseline_is_timed_warm_and_checked_code_gets_no_extra_call():
    """The harness lets its thread pools go idle before a trusted baseline's batch, then
    warms the baseline with one untimed call: a pool that is slow to wake (here 5 ms after
    a pause) costs the baseline nothing. Checked code gets no such call (a warm-up could
    feed a result cache)."""
    class ColdStart:
        """Like a thread pool: the first call after a pause pays to wake it."""

        def __init__(self, fn):
            self.fn, self.last = fn, 0.0
            self.__name__ = "cold_start"

        def __call__(self, x):
            now = time.perf_counter()
            if now - self.last > 2e-3:
                time.sleep(5e-3)
            self.last = time.perf_counter()
            return self.fn(x)

    baseline = ColdStart(kc.reference)
    checked = ColdStart(kc.reference)  # compared as the candidate: verified, never warmed
    r = compare(baseline, checked, kc.make_inputs, {"rows": 8, "cols": 64}, reference=kc.reference,
                calls=4, warmup=1, min_reps=4, max_reps=4)
    assert r.ok, r.summary()
    assert r.a.median_s < 1e-3, r.summary()  # warm: no 5 ms wake-up spread over 4 calls
    assert max(r.b.times_s) > 1e-3, r.b.times_s  # a batch after the other side's paid the wake-up
    assert np.isfinite(r.speedup)
