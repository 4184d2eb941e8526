"""A multi-threaded torch baseline times the same beside a candidate process as alone.

The bug this guards (docs/kernels.md, "Thread pools in the evaluator"): the harness's check
of the candidate's outputs called `np.linalg.norm`, whose OpenBLAS worker thread then
busy-waited ~0.1 s in the evaluator. On 2 cores that spinner took a core from the torch
baseline timed next (two OpenMP threads), and torch.softmax on 64x512 went from ~0.05 ms
to 2-8 ms per call: the candidate's speedup came out 40-160x too high.

Both measurements run in a fresh interpreter held to two CPUs, so the test sees the
2-core conditions on any machine (and its own torch/BLAS pools are not the test
runner's). Timing assertions are ratios measured side by side in one run, with margins
wide enough for a loaded machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("torch")

pytestmark = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2 or not os.path.isdir("/proc/self/task"),
    reason="needs Linux and at least two CPUs",
)

CANDIDATE = """
import torch

def softmax(x):
    return torch.softmax(x, -1)
"""

# Held to two CPUs before numpy/torch start their pools (they size them from the affinity).
PRELUDE = """
import json, os, sys, time
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
"""

TIMING = PRELUDE + """
import numpy as np
import torch
from ratchet.evaluator.kernels import CandidateProcess, bench, compare

torch.set_num_threads(2)  # the default on 2 cores, stated: the multi-threaded case is the point
SHAPE = {"rows": 64, "cols": 512}

def make_inputs(shape, dtype, rng):
    g = torch.Generator().manual_seed(int(rng.integers(2**62)))
    return torch.randn(shape["rows"], shape["cols"], generator=g, dtype=getattr(torch, dtype))

def reference(x):
    return torch.softmax(x, -1)

def baseline(x):
    return torch.softmax(x, -1)

QUICK = {"max_time_s": 0.4, "min_reps": 5}
alone, beside, speedups = [], [], []
for _ in range(4):
    # the baseline alone: no candidate process exists
    alone += bench(baseline, make_inputs, SHAPE, reference=reference, trusted=True, **QUICK).times_s
    # the same baseline, compared with a torch candidate whose outputs the harness checks
    with CandidateProcess(sys.argv[1], timeout=120) as cand:
        r = compare(baseline, cand.function("softmax"), make_inputs, SHAPE, reference=reference, **QUICK)
    assert r.ok, (r.summary(), r.a.reasons, r.b.reasons)
    beside += r.a.times_s
    speedups.append(r.speedup)
print(json.dumps({"alone": alone, "beside": beside, "speedups": speedups}))
"""

# CPU seconds the process's other threads burn in the 0.3 s after `action` (a pool left spinning).
SPIN = PRELUDE + """
import numpy as np
from ratchet.evaluator.kernels.correctness import verify_outputs

me = str(os.getpid())
tick = os.sysconf("SC_CLK_TCK")

def others_cpu():
    total = 0
    for tid in os.listdir("/proc/self/task"):
        if tid != me:
            fields = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / tick

def spun_after(action):
    time.sleep(0.4)  # whatever ran before has gone quiet
    before = others_cpu()
    action()
    time.sleep(0.3)
    return others_cpu() - before

rng = np.random.default_rng(0)
want = rng.standard_normal((64, 512))
got = (want * (1 + 1e-7)).astype(np.float32)
check = lambda: verify_outputs((got,), (want,), None, None, None)
assert check() == []
print(json.dumps({
    "blas": spun_after(lambda: np.linalg.norm(want.ravel())),  # the control: a threaded BLAS call
    "check": max(spun_after(check) for _ in range(3)),
}))
"""


def _run(script: str, *args: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_checking_outputs_leaves_no_thread_pool_spinning():
    """The cause: the harness's own output check must not wake a BLAS pool that then spins."""
    spun = _run(SPIN)
    if spun["blas"] < 0.03:
        pytest.skip(f"numpy's BLAS here does not leave a spinning thread ({spun['blas']:.2f} s CPU), nothing to compare with")
    assert spun["check"] <= 0.02, f"threads spun {spun['check']:.2f} s after the harness's check (a threaded BLAS call: {spun['blas']:.2f} s)"


@pytest.mark.timing  # a 2x bound on a two-thread baseline: 4 workers' load read 80x once
def test_two_thread_torch_baseline_times_the_same_beside_a_torch_candidate(tmp_path):
    """The symptom: the baseline's time beside a checked torch candidate is its time alone."""
    module = tmp_path / "cand.py"
    module.write_text(textwrap.dedent(CANDIDATE))
    readings = []
    # Measured on the 2-core machine before the fix: 2.4-5.9 here (and 40-160 in some runs
    # of a longer-lived candidate), every time; after it, mostly 0.7-1.3, but 1.90 and
    # 2.04 in single readings on an idle machine (stop 47). The bug shows in every
    # reading, a stray ratio in one: a ratio at the bound is measured again, up to three
    # readings, and the test fails when every one of them is at 2x or more.
    for _ in range(3):
        got = _run(TIMING, str(module))
        alone, beside = np.asarray(got["alone"]), np.asarray(got["beside"])
        # Other processes on the machine take cores from the two OpenMP threads too and
        # slow random batches of either kind, by as much as the bug did: no verdict from a
        # machine too loaded to time the baseline alone steadily.
        if np.median(alone) > 3 * alone.min():
            pytest.skip(f"machine too loaded to time a two-thread baseline: alone {alone.min() * 1e3:.4f} ms/call best, {np.median(alone) * 1e3:.4f} median")
        a50, b50 = np.median(alone), np.median(beside)
        readings.append(f"baseline {a50 * 1e3:.4f} ms/call alone, {b50 * 1e3:.4f} ms/call beside the candidate (medians of {len(alone)} and {len(beside)} batches)")
        if b50 / a50 < 2.0:
            return
    pytest.fail("the baseline beside the candidate took 2x its time alone, in three readings: " + "; ".join(readings))
