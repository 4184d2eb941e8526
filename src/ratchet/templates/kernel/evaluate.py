"""Trusted evaluator (protected): correctness on every shape, then honest timing.

Prints `correct: true|false` and `time_ms: <total of per-shape medians>`; ratchet reads
only these lines. Inputs are fresh random values with random offset and scale on every
trial, the reference is computed in float64, and the timer is captured before the
candidate is imported.
"""

import sys
import time

import numpy as np

perf_counter = time.perf_counter  # captured before candidate code runs

SHAPES = [(256, 64), (1024, 257), (2048, 512), (512, 4096)]
HOLDOUT_SHAPES = [(777, 333), (3000, 100)]
TRIALS = 2
REPEATS = 7


def reference(x: np.ndarray) -> np.ndarray:
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def make_input(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    scale = rng.uniform(0.5, 4.0)
    offset = rng.uniform(-10, 10)
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)


def main() -> int:
    holdout = "--holdout" in sys.argv
    shapes = HOLDOUT_SHAPES if holdout else SHAPES
    import kernel  # the candidate: imported only after the timer was captured

    rng = np.random.default_rng(int(perf_counter() * 1e6) % 2**32)
    for shape in shapes:
        for _ in range(TRIALS):
            x = make_input(rng, shape)
            before = x.copy()
            out = kernel.softmax(x)
            if type(out) is not np.ndarray or out.shape != x.shape or out.dtype != x.dtype:
                print(f"wrong result type/shape/dtype for {shape}")
                print("correct: false")
                return 0
            if not np.array_equal(x, before):
                print(f"input mutated for {shape}")
                print("correct: false")
                return 0
            if not np.isfinite(out).all() or not np.allclose(out, reference(x), rtol=1e-4,
                                                             atol=1e-6):
                print(f"wrong values for {shape}")
                print("correct: false")
                return 0
    total_ms = 0.0
    for shape in shapes:
        inputs = [make_input(rng, shape) for _ in range(3)]
        kernel.softmax(inputs[0])  # warm-up
        times = []
        for i in range(REPEATS):
            x = inputs[i % len(inputs)]
            start = perf_counter()
            kernel.softmax(x)
            times.append(perf_counter() - start)
        median = sorted(times)[len(times) // 2] * 1000
        print(f"shape {shape}: {median:.3f} ms")
        total_ms += median
    if perf_counter is not time.perf_counter:
        print("timer was replaced")
        print("correct: false")
        return 0
    print("correct: true")
    print(f"time_ms: {total_ms:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
