"""Trusted evaluator (protected): correctness on every shape, then honest timing.

Reports `correct`, `time_ms` (sum over shapes of the per-call median) and `time_ms_sem`
(its standard error) through ratchet's trusted metric channel; per-shape details go to
stderr (the log). Built on ratchet's kernel harness (`ratchet.kernels`, see
docs/kernels.md). The candidate's kernel.py is never imported here: it runs in a child
process (`rk.CandidateProcess`) that sees no metric channel, no hold-out marker and no
secrets, and whose output goes to its own log. This process keeps the checks, the clock,
the reference and the report:

1. correctness: every shape, fresh random inputs each trial with a random offset and
   scale (large enough that a softmax without the max-subtraction overflows), the
   previous trial's buffers refilled in place (a cache keyed on the pointer misses), a
   float64 reference, exact dtype/shape, no NaN/Inf, outputs fully written into
   poisoned buffers and unchanged after the call answered, inputs unchanged, two calls
   bit-identical;
2. timing: batches of calls on distinct buffer sets, every input refilled with fresh
   random data before each batch, this process's clock around each batch, every
   batch's outputs read back and a random sample of its calls checked against the
   reference (the candidate cannot tell timed calls from checked ones).

`--holdout` (or RATCHET_HOLDOUT set, as ratchet's worker does for the hold-out phase)
checks and times the hold-out shapes instead, which the proposer never sees.
Kept fast on purpose: a study runs it for every candidate.

Run as `python -P evaluate.py` (ratchet.toml): `-P` keeps this directory, which the
candidate's tree shares, off `sys.path`, so a module the candidate writes here (a
`ratchet/` package, an `opt_einsum.py` torch would import) is never imported by this
trusted process. And every import comes before any candidate code runs: whatever is
loaded later could come from a file the candidate wrote meanwhile. The child is started
first, held (`hold=True`): its interpreter and numpy load while this process imports its
own, and kernel.py is imported there only at the harness's first call, after them all.
"""

import math
import os
import sys
from pathlib import Path

from ratchet.isolate import CandidateProcess

HERE = Path(__file__).resolve().parent
CANDIDATE = CandidateProcess(HERE / "kernel.py", timeout=60, hold=True, preload=["numpy"])

import numpy as np  # noqa: E402 - after the held child's start, before any candidate code runs

import ratchet.kernels as rk  # noqa: E402

SHAPES = [{"rows": 256, "cols": 64}, {"rows": 1024, "cols": 257}, {"rows": 2048, "cols": 512}, {"rows": 512, "cols": 4096}]
HOLDOUT_SHAPES = [{"rows": 777, "cols": 333}, {"rows": 3000, "cols": 100}]
TRIALS = 2  # per shape; odd trials reuse the previous trial's buffers
TIMING = {"warmup": 1, "min_reps": 3, "max_time_s": 0.1, "verify": 1}  # per shape


def reference(x: np.ndarray) -> np.ndarray:
    """Row softmax; the harness hands it float64 copies of the candidate's inputs."""
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def make_inputs(shape: dict, dtype: str, rng: np.random.Generator) -> np.ndarray:
    # The harness then scales by 1e-2..16 and shifts again, so row maxima reach the
    # hundreds: exp() overflows float32 unless the kernel subtracts the row max.
    # Uniform draws: several times cheaper than normal ones.
    x = rng.random((shape["rows"], shape["cols"]), dtype=np.float32)
    x *= np.float32(8.0)
    x += np.float32(rng.uniform(-54.0, 46.0))
    return x


def fail(reason: str) -> int:
    rk.emit({"correct": False, "reason": reason})
    return 0


def main() -> int:
    holdout = rk.load_holdout(HOLDOUT_SHAPES)  # [] unless this is the hold-out run
    shapes = holdout or SHAPES
    seed = int.from_bytes(os.urandom(4), "little")  # unpredictable inputs, printed to reproduce
    print(f"seed {seed}, {'hold-out' if holdout else 'public'} shapes", file=sys.stderr)
    with CANDIDATE as cand:
        softmax = cand.function("softmax")
        report = rk.check(softmax, reference, make_inputs, shapes, trials=TRIALS, seed=seed)
        print(report.summary(), file=sys.stderr)
        for reason in report.reasons():
            print(f"  {reason}", file=sys.stderr)
        if not report.ok:
            print(f"candidate log:\n{cand.log_tail()}", file=sys.stderr)
            return fail(report.reasons()[0])
        total_ms, var_ms, precise = 0.0, 0.0, True
        for shape in shapes:
            result = rk.bench(softmax, make_inputs, shape, reference=reference, name=rk.shape_key(shape), seed=seed, **TIMING)
            print(result.summary(), file=sys.stderr)
            if not result.ok:
                return fail(result.reasons[0])
            total_ms += result.time_ms
            var_ms += (result.sem_s * 1e3) ** 2
            precise = precise and result.converged
    rk.emit({"correct": True, "time_ms": total_ms, "time_ms_sem": math.sqrt(var_ms), "timing_precise": precise})
    return 0


if __name__ == "__main__":
    sys.exit(main())
