"""ratchet.evaluator.kernels: the harness a kernel evaluator imports.

The evaluator never imports the candidate. It starts it in a child process
(`CandidateProcess`, from ratchet.evaluator.isolate) and hands the harness a handle on its
function; the checks, the clock, the baseline, the reference, the roofline and the
metric report all stay in the evaluator's process:

    import ratchet.evaluator.kernels as rk
    with rk.CandidateProcess("kernel.py") as cand:
        report = rk.sweep(cand.function("softmax"), baseline, reference, make_inputs, shapes)
    rk.emit(report)

Rooms, one job each:
- runner              how an implementation is called: in its process, or here (trusted)
- correctness.check   is it right (float64 reference, every guard)
- timing.bench/compare how fast, honestly (warm-up, SEM stop, cold cache, A/B interleave)
- roofline            measured peaks, % of bound, bottleneck, impossible times
- sweep               all of the above per shape, hold-out shapes, metric lines
- dispatch            per-bucket fastest-correct table with library fallback
- hardware            hardware.md / model.md context for proposers
- workload            a declared workload and its profile (workload.json), shape weights
- profile             `ratchet profile`: the model under torch.profiler (imports torch itself)
- endtoend            the model with and without a kernel, in children (import it by name)
"""

from ..isolate import CandidateError, CandidateProcess, RemoteFunction
from . import sweep  # the module, callable: rk.sweep(...) runs a sweep
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
    write_hardware_md,
)
from .runner import LocalRunner, RemoteRunner, Runner
from .sweep import (
    HOLDOUT_ENV,
    PerShape,
    ShapeResult,
    SweepReport,
    emit,
    format_metrics,
    geomean,
    holdout_requested,
    load_holdout,
    ordered_metrics,
)
from .timing import BenchResult, CompareResult, bench, compare
from .workload import Profile, Workload, load_profile, op_shapes, save_profile, weighted_metrics

__all__ = [
    "DEFAULT_TOLERANCES",
    "HOLDOUT_ENV",
    "MODEL_MD_TEMPLATE",
    "BenchResult",
    "CandidateError",
    "CandidateProcess",
    "CaseResult",
    "CheckReport",
    "CompareResult",
    "Dispatcher",
    "LocalRunner",
    "PerShape",
    "Peaks",
    "Profile",
    "RemoteFunction",
    "RemoteRunner",
    "RooflinePoint",
    "Runner",
    "ShapeResult",
    "SweepReport",
    "Workload",
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
    "load_profile",
    "measure_peaks",
    "next_pow2",
    "op_shapes",
    "ordered_metrics",
    "peaks_cache_path",
    "results_from_sweeps",
    "save_peaks",
    "save_profile",
    "shape_key",
    "sweep",
    "tolerance",
    "verify_timers",
    "weighted_metrics",
    "write_dispatch",
    "write_hardware_md",
    "write_model_md",
]
