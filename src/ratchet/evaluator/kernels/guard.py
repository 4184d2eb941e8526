"""Capture the trusted process's timer and comparison functions, and verify them later.

Since the harness runs candidates in their own process (ratchet.evaluator.isolate), candidate code
never runs here, and this is no longer the defence: it is a tripwire. It catches an
evaluator that (against docs/kernels.md) imported candidate code after the harness, or a
sitecustomize that patched the clock: we keep the original function objects from import
time, time with those, and compare what the modules hold now with what we kept. A
mismatch is reported with the name of the replaced function and fails the run.

torch is optional, so its timers are captured when `capture_timers()` is called after
``import torch``, or at this module's import if torch was loaded already.
"""

from __future__ import annotations

import sys
import time
import types
from typing import Any

import numpy as np

# Dotted names of the functions the harness relies on. Module-level attributes only.
_TIME_NAMES = ("time.perf_counter", "time.perf_counter_ns", "time.monotonic", "time.sleep")
_NUMPY_NAMES = (
    "numpy.isfinite",
    "numpy.isnan",
    "numpy.abs",
    "numpy.array_equal",
    "numpy.shares_memory",
    "numpy.copyto",
    "numpy.max",
    "numpy.square",
    "numpy.sum",
)
_TORCH_NAMES = (
    "torch.cuda.synchronize",
    "torch.cuda.Event",
    "torch.cuda.Event.record",
    "torch.cuda.Event.elapsed_time",
    "torch.cuda.Event.synchronize",
    "torch.Tensor.copy_",
    "torch.Tensor.clone",
    "torch.equal",
)

ORIGINALS: dict[str, Any] = {}

# The harness's own clock, used by timing.py. Kept as a module attribute so that
# replacing it (``guard.clock = fake``) is itself detectable.
clock = time.perf_counter
_CLOCK = time.perf_counter


def _resolve(dotted: str) -> Any:
    """Look up 'pkg.mod.Attr.attr' as it is *now*."""
    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        module = sys.modules.get(module_name)
        if module is None:
            continue
        obj: Any = module
        for attr in parts[cut:]:
            obj = getattr(obj, attr)
        return obj
    raise LookupError(dotted)


def capture_timers() -> list[str]:
    """Record the current timer/sync/comparison functions; returns the names captured.

    Names captured once are never re-captured: a later call cannot launder a patch.
    """
    names = list(_TIME_NAMES) + list(_NUMPY_NAMES)
    if "torch" in sys.modules:
        names += list(_TORCH_NAMES)
    captured = []
    for name in names:
        if name in ORIGINALS:
            continue
        try:
            ORIGINALS[name] = _resolve(name)
        except (LookupError, AttributeError):
            continue
        captured.append(name)
    return captured


def _is_builtin_of(func: Any, module: types.ModuleType) -> bool:
    return isinstance(func, types.BuiltinFunctionType) and getattr(func, "__self__", None) is module


def verify_timers() -> list[str]:
    """Reasons the trusted functions cannot be trusted any more; empty when all is well."""
    problems: list[str] = []
    for name, original in ORIGINALS.items():
        try:
            current = _resolve(name)
        except (LookupError, AttributeError):
            problems.append(f"{name} was removed after the harness was imported")
            continue
        if current is not original:
            where = getattr(current, "__module__", None) or type(current).__name__
            problems.append(
                f"{name} was replaced after the harness was imported (now {where}.{getattr(current, '__qualname__', '?')}): timer/comparison patched"
            )
    # time.* must be the C builtins of the time module: catches a patch made even before
    # the harness was imported (a candidate imported first, or a sitecustomize).
    for name in _TIME_NAMES:
        func = getattr(time, name.split(".", 1)[1])
        if not _is_builtin_of(func, time):
            problems.append(f"{name} is not the builtin from the time module: timer patched")
    this = sys.modules[__name__]
    if this.clock is not _CLOCK or not _is_builtin_of(_CLOCK, time):
        problems.append("ratchet.evaluator.kernels.guard.clock (the harness's own timer) was replaced")
    if not isinstance(np.isfinite, np.ufunc):
        problems.append("numpy.isfinite is not a numpy ufunc: comparison patched")
    return problems


capture_timers()
