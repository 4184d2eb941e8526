"""Row-wise softmax over a float32 matrix: the kernel under research.

The knobs below are module-level literals that ratchet's tuner rewrites. Processing one
row per numpy call (CHUNK_ROWS = 1) pays Python's per-call overhead thousands of times;
very large chunks spill temporaries out of cache. The best setting depends on the
machine, which is the point of measuring.
"""

import numpy as np

CHUNK_ROWS = 1  # rows handed to numpy per call
INPLACE = False  # reuse the output buffer instead of allocating temporaries


def softmax(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    rows = x.shape[0]
    for start in range(0, rows, CHUNK_ROWS):
        block = x[start : start + CHUNK_ROWS]
        peak = block.max(axis=1, keepdims=True)
        if INPLACE:
            dest = out[start : start + CHUNK_ROWS]
            np.subtract(block, peak, out=dest)
            np.exp(dest, out=dest)
            dest /= dest.sum(axis=1, keepdims=True)
        else:
            exp = np.exp(block - peak)
            out[start : start + CHUNK_ROWS] = exp / exp.sum(axis=1, keepdims=True)
    return out
