"""Backend-neutral array helpers: numpy arrays always, torch tensors when torch is loaded.

Why this room exists: every guard in the harness (clone, compare, poison, alias) must
work the same on a numpy array and on a torch tensor on any device, and torch must stay
optional. So torch is never imported here: a value is a torch tensor only if the
caller already imported torch (``sys.modules``), which is the only way one could exist.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ratchet.evaluator.isolate import is_torch, loaded_torch, torch_module  # one definition

# Value written into integer output buffers before a run, so that unwritten elements show.
INT_SENTINEL = -0x5EED  # fits int16 and wider; int8/uint types use their own extreme


def is_array(x: Any) -> bool:
    """A numpy array or a torch tensor (subclasses included: see `materialisation_problem`)."""
    return isinstance(x, np.ndarray) or is_torch(x)


def dtype_name(x: Any) -> str:
    """'float32', 'bfloat16', 'int64', ... for either backend."""
    if is_torch(x):
        return str(x.dtype).removeprefix("torch.")
    return np.dtype(x.dtype).name


def is_floating(x: Any) -> bool:
    if is_torch(x):
        return bool(x.is_floating_point())
    return np.issubdtype(x.dtype, np.floating)


def materialisation_problem(x: Any) -> str | None:
    """Why `x` is not a plain, materialised array, or None when it is.

    A subclass (np.matrix, np.memmap, a torch FakeTensor or __torch_function__ wrapper) can
    defer or fake work until someone reads it, e.g. in the untimed correctness check.
    """
    if isinstance(x, np.ndarray):
        if type(x) is not np.ndarray:
            return f"output is a {type(x).__module__}.{type(x).__name__} (an ndarray subclass), not a plain numpy array"
        if x.size > 1 and 0 in x.strides:
            return "output has a zero stride (a broadcast view), not a materialised array"
        return None
    if is_torch(x):
        torch = loaded_torch()
        if type(x) is not torch.Tensor:
            return f"output is a {type(x).__module__}.{type(x).__name__} (a tensor subclass), not a plain torch.Tensor"
        if x.device.type == "meta":
            return "output is a meta tensor (no data)"
        if x.layout != torch.strided:
            return f"output has layout {x.layout}, not a dense strided tensor"
        if x.numel() > 1 and 0 in x.stride():
            return "output has a zero stride (an expanded view), not a materialised tensor"
        return None
    kind = type(x).__name__
    if hasattr(x, "__next__") or hasattr(x, "send"):
        return f"output is a {kind} (lazy iterator), not an array"
    return f"output is a {kind}, not a numpy array or torch tensor"


def clone(x: Any) -> Any:
    if is_torch(x):
        return x.detach().clone()
    return np.array(x, copy=True)


def to_numpy64(x: Any) -> np.ndarray:
    """A float64 (or int64 for integers) numpy copy for comparison on the host."""
    if is_torch(x):
        torch = loaded_torch()
        t = x.detach()
        if t.is_floating_point() or t.is_complex():
            t = t.to(dtype=torch.float64)
        else:
            t = t.to(dtype=torch.int64)
        return t.cpu().numpy()
    a = np.asarray(x)
    if np.issubdtype(a.dtype, np.floating):
        return a.astype(np.float64)
    if np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_:
        return a.astype(np.int64)
    return a.astype(np.float64)


def upcast(x: Any) -> Any:
    """The same values in float64 on the same backend and device (integers unchanged).

    The reference runs on these, so its own rounding error is far below the tolerance.
    """
    if is_torch(x):
        torch = loaded_torch()
        if x.is_floating_point():
            return x.detach().to(dtype=torch.float64)
        return x.detach().clone()
    if isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating):
        return x.astype(np.float64)
    if isinstance(x, np.ndarray):
        return x.copy()
    return x


def same_bits(a: Any, b: Any) -> bool:
    """Exactly equal, dtype and shape included (NaNs in the same places count as equal)."""
    if is_torch(a) != is_torch(b):
        return False
    if is_torch(a):
        if a.dtype != b.dtype or a.shape != b.shape:
            return False
        if a.is_floating_point():
            return bool(((a == b) | (a.isnan() & b.isnan())).all())
        return bool((a == b).all())
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return bool(np.array_equal(a, b, equal_nan=np.issubdtype(a.dtype, np.floating)))


def _span(x: Any) -> tuple[int, int]:
    """[start, end) byte range of the memory a tensor's storage covers."""
    storage = x.untyped_storage()
    start = storage.data_ptr()
    return start, start + storage.nbytes()


def shares_memory(a: Any, b: Any) -> bool:
    """True when the two arrays may touch the same memory (conservative for torch)."""
    if is_torch(a) and is_torch(b):
        if a.device != b.device:
            return False
        if a.numel() == 0 or b.numel() == 0:
            return False
        a0, a1 = _span(a)
        b0, b1 = _span(b)
        return a0 < b1 and b0 < a1
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.shares_memory(a, b))
    return False


def equal(a: Any, b: Any) -> bool:
    """Same values, fast (NaN never equals: use after a finiteness check)."""
    if is_torch(a) and is_torch(b):
        return bool(a.shape == b.shape and a.dtype == b.dtype and loaded_torch().equal(a, b))
    if is_torch(a) or is_torch(b):
        return False
    return a.shape == b.shape and a.dtype == b.dtype and bool(np.array_equal(a, b))


def clean(x: Any) -> bool:
    """Fast check: no poison value left and (floats) no NaN/Inf anywhere."""
    if is_floating(x):
        if is_torch(x):
            return bool(loaded_torch().isfinite(x).all())
        return bool(np.isfinite(x).all())
    value = poison_value(x)
    if is_torch(x):
        return not bool((x == value).any())
    return not bool((x == value).any())


def poison_value(x: Any) -> float | int:
    if is_floating(x):
        return float("nan")
    if is_torch(x):
        torch = loaded_torch()
        if x.dtype == torch.bool:
            return True
        info = torch.iinfo(x.dtype)
    else:
        if x.dtype == np.bool_:
            return True
        info = np.iinfo(x.dtype)
    return INT_SENTINEL if info.min <= INT_SENTINEL <= info.max else int(info.max)


def poison_(x: Any) -> Any:
    """Fill a buffer with NaN (floats) or a sentinel (integers), in place."""
    value = poison_value(x)
    if is_torch(x):
        x.fill_(value)
    else:
        x.fill(value)
    return x


def count_poisoned(x: Any) -> int:
    """How many elements still hold the poison value."""
    a = to_numpy64(x)
    value = poison_value(x)
    if isinstance(value, float):
        return int(np.isnan(a).sum())
    return int((a == int(value)).sum())


def copy_into(dst: Any, src: Any) -> None:
    """Overwrite `dst`'s values with `src`'s, keeping dst's memory (same pointer, new data)."""
    if is_torch(dst):
        dst.copy_(src)
    else:
        np.copyto(dst, src)


def perturb_(x: Any, scale: float, offset: float) -> None:
    """x <- x * scale + offset in place, for floating arrays only."""
    if not is_floating(x):
        return
    if is_torch(x):
        x.mul_(scale).add_(offset)
    else:
        x *= x.dtype.type(scale)
        x += x.dtype.type(offset)


def synchronize(values: Any) -> None:
    """Wait for device work on any CUDA tensor among `values` (no-op on CPU)."""
    torch = torch_module()
    if torch is None:
        return
    for v in values:
        if is_torch(v) and v.is_cuda:
            torch.cuda.synchronize(v.device)
            return


def nbytes(x: Any) -> int:
    if is_torch(x):
        return int(x.numel() * x.element_size())
    return int(getattr(x, "nbytes", 0))


def as_tuple(value: Any) -> tuple[Any, ...]:
    """Outputs and inputs may be one array or a tuple/list of arrays."""
    if isinstance(value, tuple):
        return value
    if isinstance(value, list):
        return tuple(value)
    return (value,)


def jsonable(value: Any) -> Any:
    """A copy that json.dumps writes as strict JSON: non-finite floats become None."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [jsonable(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not np.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
