"""ratchet.kernels: the harness a kernel evaluator imports.

Import this *before* the candidate's code: it captures the timer and comparison
functions at import (guard.py) so that a candidate that patches them is caught.
With torch, import torch first and call `capture_timers()` before importing the
candidate, so torch's CUDA timers are captured too.

Rooms, one job each:
- correctness.check   is it right (float64 reference, every guard)
- timing.bench/compare how fast, honestly (warm-up, SEM stop, cold cache, A/B interleave)
- roofline            measured peaks, % of bound, bottleneck, impossible times
- sweep               all of the above per shape, hold-out shapes, metric lines
- dispatch            per-bucket fastest-correct table with library fallback
- hardware            hardware.md / model.md context for proposers
"""

from .correctness import (
    DEFAULT_TOLERANCES,
    CaseResult,
    CheckReport,
    check,
    check_case,
    shape_key,
    tolerance,
)
from .dispatch import (
    Dispatcher,
    bucket_of,
    build_dispatch_table,
    dispatch,
    dispatch_markdown,
    load_dispatch,
    next_pow2,
    results_from_sweeps,
    write_dispatch,
)
from .guard import capture_timers, verify_timers
from .hardware import (
    MODEL_MD_TEMPLATE,
    hardware_context,
    hardware_markdown,
    library_versions,
    llc_bytes,
    write_hardware_md,
    write_model_md,
)
from .roofline import (
    Peaks,
    RooflinePoint,
    assess,
    cached_peaks,
    device_name,
    evaluate,
    load_peaks,
    measure_peaks,
    peaks_cache_path,
    save_peaks,
)
from .sweep import (
    HOLDOUT_ENV,
    ShapeResult,
    SweepReport,
    emit,
    format_metrics,
    geomean,
    holdout_requested,
    load_holdout,
    sweep,
)
from .timing import BenchResult, CompareResult, bench, compare

__all__ = [
    "DEFAULT_TOLERANCES",
    "HOLDOUT_ENV",
    "MODEL_MD_TEMPLATE",
    "BenchResult",
    "CaseResult",
    "CheckReport",
    "CompareResult",
    "Dispatcher",
    "Peaks",
    "RooflinePoint",
    "ShapeResult",
    "SweepReport",
    "assess",
    "bench",
    "bucket_of",
    "build_dispatch_table",
    "cached_peaks",
    "capture_timers",
    "check",
    "check_case",
    "compare",
    "device_name",
    "dispatch",
    "dispatch_markdown",
    "emit",
    "evaluate",
    "format_metrics",
    "geomean",
    "hardware_context",
    "hardware_markdown",
    "holdout_requested",
    "library_versions",
    "llc_bytes",
    "load_dispatch",
    "load_holdout",
    "load_peaks",
    "measure_peaks",
    "next_pow2",
    "peaks_cache_path",
    "results_from_sweeps",
    "save_peaks",
    "shape_key",
    "sweep",
    "tolerance",
    "verify_timers",
    "write_dispatch",
    "write_hardware_md",
    "write_model_md",
]
