"""Row softmax in Triton: the file a proposer edits.

softmax(x, out) for a 2-D CUDA tensor x (rows x cols, fp16/bf16/fp32), along the last
dim, accumulating in fp32, written into `out` (the evaluator passes a buffer it owns).
Two kernels, and torch.softmax for the shape buckets listed in TORCH_FALLBACK:
- rows up to MAX_FUSED_COLS columns: one program per row holds the whole row in
  registers (one read, one write);
- longer rows (long contexts, up to 32k+): one program per row streams the row in
  BLOCK_SIZE chunks with an online max/sum (two reads, one write).

The knobs below are module-level literals so the `tune` proposer can set them
(see [tune.knobs] in ratchet.toml); an LLM or agent proposer may change anything here.
"""

import torch
import triton
import triton.language as tl

BLOCK_SIZE = 2048  # columns per step of the streaming kernel
NUM_WARPS = 8  # warps per program (both kernels)
MAX_FUSED_COLS = 8192  # rows up to this many columns use the one-block kernel


@triton.jit
def _softmax_fused(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(in_ptr + row * in_stride + offs, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=0)
    num = tl.exp(x)
    y = num / tl.sum(num, axis=0)
    tl.store(out_ptr + row * out_stride + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_streaming(out_ptr, in_ptr, in_stride, out_stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    row_in = in_ptr + row * in_stride
    row_out = out_ptr + row * out_stride
    offs = tl.arange(0, BLOCK)
    # Pass 1: per-lane running max m and sum s of exp(x - m) (online softmax).
    m = tl.full((BLOCK,), -float("inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    for start in range(0, n_cols, BLOCK):
        mask = start + offs < n_cols
        x = tl.load(row_in + start + offs, mask=mask, other=-float("inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        seen = m_new > -float("inf")  # lanes that saw no element yet must stay 0, not NaN
        s = tl.where(seen, s * tl.exp(m - m_new) + tl.exp(x - m_new), 0.0)
        m = m_new
    m_row = tl.max(m, axis=0)
    s_row = tl.sum(tl.where(m > -float("inf"), s * tl.exp(m - m_row), 0.0), axis=0)
    # Pass 2: write exp(x - max) / sum.
    for start in range(0, n_cols, BLOCK):
        mask = start + offs < n_cols
        x = tl.load(row_in + start + offs, mask=mask, other=-float("inf")).to(tl.float32)
        y = tl.exp(x - m_row) / s_row
        tl.store(row_out + start + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


# Shape buckets where torch.softmax beats this kernel: (next power of two of cols, dtype).
# Filled from a measured dispatch table (`python evaluate.py --dispatch dispatch.json`
# prints it); empty until this revision has been measured on a GPU.
TORCH_FALLBACK: frozenset[tuple[int, str]] = frozenset()


def _torch_softmax(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    try:
        return torch.ops.aten._softmax.out(x, -1, False, out=out)
    except (RuntimeError, TypeError):  # older torch: one extra copy
        return out.copy_(torch.softmax(x, dim=-1))


def softmax(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim of a 2-D tensor, into `out` (allocated when None)."""
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D tensor, got shape {tuple(x.shape)}")
    if x.stride(-1) != 1:
        x = x.contiguous()
    n_rows, n_cols = x.shape
    if out is None:
        out = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)
    if n_rows == 0 or n_cols == 0:
        return out
    if (triton.next_power_of_2(n_cols), str(x.dtype).removeprefix("torch.")) in TORCH_FALLBACK:
        return _torch_softmax(x, out)
    if n_cols <= MAX_FUSED_COLS:
        block = triton.next_power_of_2(n_cols)
        _softmax_fused[(n_rows,)](out, x, x.stride(0), out.stride(0), n_cols, BLOCK=block, num_warps=NUM_WARPS)
    else:
        _softmax_streaming[(n_rows,)](out, x, x.stride(0), out.stride(0), n_cols, BLOCK=BLOCK_SIZE, num_warps=NUM_WARPS)
    return out
