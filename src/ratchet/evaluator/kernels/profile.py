"""`ratchet profile`: what a model computes under a declared workload, and where its time goes.

The model runs under `torch.profiler` (the operator records PyTorch already keeps:
name, input shapes and dtypes, FLOPs of matmuls, inclusive and self times); nothing here
traces by hand. Each swappable operator of the model (its `OPS` table) is labelled
`model::<name>` for the run, so its composed ops count as one; every other operator
counts where it is called from the forward pass itself (its inclusive time), so the rows
partition the forward pass and their sum is checked against the forward's measured time
(`Profile.coverage`); what no operator covers is host time between them (Python, the
calls' argument parsing), reported as such, never spread over the rows.

The profiler's own cost is kept out of the times. Recording shapes and FLOPs costs
microseconds per event, and a forward has hundreds of nested events: on CPU it made
the profiled forward 2-4x the model's (measured on the bundled tiny model), swelling
most the operators made of many small ones. So the shapes, dtypes and FLOPs come from
one forward profiled with them, and the times from `steps` forwards profiled without
them, matched event for event (the same model on the same inputs calls the same
operators in the same order); on CPU each operator's time and each gap between two is
its median over those forwards (`_op_times`), with the garbage collector off. The
labels are the profiler's fast C++ range where the model runs eagerly:
`record_function` costs ~5-8 us per range from Python, which sat between the operators
and counted as nobody's time.

Out of it come `workload.json` (`workload.Profile`: each operator with its input shapes,
dtypes, calls and time share, grouped by shape; the largest shapes of each marked as
hold-out), a ranked table (share of time, bottleneck class from the measured roofline,
the roofline bound, and Amdahl's bound on the model's speed-up if that operator reached
it) and a generated `model.md` for proposers.

torch is imported only when a profile is taken: `import ratchet.evaluator.kernels` never needs it.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import importlib.util
import math
import resource
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import numpy as np

from ...core.errors import UserError
from .hardware import library_versions
from .roofline import ITEMSIZE, Peaks, assess, evaluate, measure_peaks
from .workload import (
    Mode,
    OpRecord,
    Profile,
    ShapeRecord,
    Workload,
    group_shapes,
    mark_holdout,
    point_label,
)

PREFIX = "model::"
FORWARD = "ratchet::forward"


def import_torch() -> Any:
    try:
        import torch  # noqa: PLC0415 - optional: only a profile or an end-to-end check needs it
    except ImportError:
        raise UserError("profiling a model needs torch: install it into this environment (`make install` does)") from None
    return torch


def load_model_module(path: Path, name: str = "ratchet_profiled_model") -> ModuleType:
    """Import the model module from its file (its directory first on sys.path meanwhile)."""
    if not path.is_file():
        raise UserError(f"model module {path} does not exist: set `model` in the workload to the model's .py file")
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"{path}: not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    try:
        spec.loader.exec_module(module)
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(str(path.parent))
    missing = [n for n in ("OPS", "build_model", "make_inputs") if not hasattr(module, n)]
    if missing:
        raise UserError(f"{path}: the model module lacks {', '.join(missing)} (docs/kernels.md: the model protocol)")
    return module


def row_shape(dims: Sequence[int]) -> dict[str, int]:
    """A row-wise operator's named dims from its first input's shape: rows x cols."""
    dims = [int(d) for d in dims]
    if not dims:
        return {}
    return {"rows": math.prod(dims[:-1]) if len(dims) > 1 else 1, "cols": dims[-1]}


def shape_of(module: ModuleType, op: str, dims: Sequence[int]) -> dict[str, Any]:
    """The model's own SHAPE_OF[op](dims) when it has one, else rows x cols."""
    custom = getattr(module, "SHAPE_OF", {}).get(op)
    return dict(custom(list(dims))) if custom else row_shape(dims)


def range_of(torch: Any, compiled: bool = False) -> Callable[[str], Any]:
    """The profiler range a label is made with: torch's fast C++ one (~0.5 us a range
    under the profiler, where `record_function` takes ~8 us from Python), except under
    torch.compile, which knows `record_function` and would break its graph on the other."""
    if compiled:
        return cast(Callable[[str], Any], torch.profiler.record_function)
    return cast(Callable[[str], Any], torch._C._profiler._RecordFunctionFast)


@contextlib.contextmanager
def labelled_ops(module: ModuleType, torch: Any, compiled: bool = False) -> Iterator[None]:
    """Each OPS entry wrapped in a profiler range `model::<name>` for the run."""
    originals = dict(module.OPS)
    label = range_of(torch, compiled)

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def labelled(*args: Any, **kwargs: Any) -> Any:
            with label(PREFIX + name):
                return fn(*args, **kwargs)

        return labelled

    for name, fn in originals.items():
        module.OPS[name] = wrap(name, fn)
    try:
        yield
    finally:
        module.OPS.clear()
        module.OPS.update(originals)


def _to_device(values: Any, device: str, torch: Any) -> tuple[Any, ...]:
    values = values if isinstance(values, tuple | list) else (values,)
    return tuple(v.to(device) if isinstance(v, torch.Tensor) else v for v in values)


def _first_shapes(event: Any) -> tuple[list[list[int]], list[str]]:
    """A labelled range has no shapes of its own: its first operator's inputs are its inputs."""
    stack = list(event.cpu_children)
    while stack:
        child = stack.pop(0)
        shapes = [list(s) for s in (child.input_shapes or [])]
        if shapes and shapes[0]:
            return shapes, list(getattr(child, "input_dtypes", None) or [])
        stack[:0] = list(child.cpu_children)
    return [], []


@contextlib.contextmanager
def _no_gc() -> Iterator[None]:
    """The garbage collector off while forwards are timed, as `timeit` does: a pause
    falls between operators, where the interpreter allocates, and a profile makes much
    garbage of its own (its event objects: one profile of the example at width 256 ran
    0.5-1k collections, 4-6 s in all at load 8, most of them outside the timed forwards)."""
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _preemptions() -> int:
    """How often the OS has taken the CPU from this process (involuntary context switches)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw


def _op_times(recorded: Sequence[Any], timed: Sequence[tuple[int, Any]], on_device: bool) -> tuple[list[float], float, int]:
    """Each recorded operator's time, the forward's, and how many timed forwards they
    come from (0: none called the recorded operators in the same order).

    `timed`: (times preempted, forward) of each timed forward. On a shared machine time
    the process did not run is in no operator's records, and where it fell, in an
    operator or between two, is chance: the fastest forward alone was preempted too
    (at load 9, one of 3 ms covered 35%). So on CPU each operator's time, and each gap
    between two (host time), is its median over the forwards, the forward's their sum:
    a preemption moves one piece of one forward. On a device its time is the kernels',
    from the forward preempted least, then the fastest.
    """
    names = [e.name for e in recorded]
    same = [(n, f) for n, f in timed if [e.name for e in _top_level(f)] == names]
    if not same:
        return [], 0.0, 0
    if on_device:
        chosen = min(same, key=lambda pf: (pf[0], _span_s(pf[1], True)))[1]
        return [_span_s(e, True) for e in _top_level(chosen)], _span_s(chosen, False), 1
    ops: list[list[float]] = [[] for _ in names]
    gaps: list[list[float]] = [[] for _ in range(len(names) + 1)]
    for _, forward in same:
        edge = forward.time_range.start
        for i, event in enumerate(_top_level(forward)):
            ops[i].append(_span_s(event, False))
            gaps[i].append((event.time_range.start - edge) * 1e-6)
            edge = event.time_range.end
        gaps[-1].append((forward.time_range.end - edge) * 1e-6)
    times = [statistics.median(t) for t in ops]
    return times, sum(times) + sum(max(0.0, statistics.median(g)) for g in gaps), len(same)


def _forwards(prof: Any) -> list[Any]:
    return [e for e in prof.function_events if e.name == FORWARD]


def _profiler(torch: Any, on_device: bool, **options: Any) -> Any:
    """The profiler `torch.profiler.profile` starts for these activities (kineto; the CPU,
    and CUDA on a device), used directly: `torch.profiler.profile` first asks
    `hasattr(torch, "_inductor")`, which imports inductor and dynamo (1.5 CPU-seconds,
    measured on the 2-core machine) in a profile that never compiles."""
    return torch.autograd.profiler.profile(use_cpu=True, use_device="cuda" if on_device else None, use_kineto=True, **options)


def _top_level(forward: Any) -> list[Any]:
    """The operators the forward pass calls itself, in the order it calls them."""
    return sorted(forward.cpu_children, key=lambda e: e.time_range.start)


def _flops(event: Any) -> float:
    total = float(getattr(event, "flops", 0) or 0)
    return total + sum(_flops(c) for c in event.cpu_children)


def _torch_dtype(name: str) -> str:
    """'float' -> 'float32' (the profiler records c10 scalar type names)."""
    return {"float": "float32", "double": "float64", "half": "float16", "c10::BFloat16": "bfloat16", "c10::Half": "float16",
            "long int": "int64", "int": "int32", "bool": "bool"}.get(name, name)


def _estimate_bytes(shapes: Sequence[Sequence[int]], dtypes: Sequence[str], fallback: str) -> float:
    """Inputs read once plus one output the size of the largest input (an estimate)."""
    sizes = []
    for i, dims in enumerate(shapes):
        if not dims:
            continue
        dtype = _torch_dtype(dtypes[i]) if i < len(dtypes) and dtypes[i] else fallback
        sizes.append(math.prod(int(d) for d in dims) * ITEMSIZE.get(dtype, 4))
    return float(sum(sizes) + (max(sizes) if sizes else 0))


def _span_s(event: Any, on_device: bool) -> float:
    return float(event.device_time_total if on_device else event.cpu_time_total) * 1e-6


def _graphed(torch: Any, model: Any, inputs: tuple[Any, ...]) -> Callable[[], None]:
    """The forward captured in one CUDA graph (after a side-stream warm-up): its replay.

    Under `mode = "cuda_graphs"` the time without the profiler is the replay's; the
    operator records and their shares come from eager forwards (a replay has no
    per-operator records), so they overstate launch overhead the graph removes.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            model(*inputs)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        model(*inputs)
    return graph.replay


def profile_model(
    workload: Workload,
    *,
    peaks: Peaks | None = None,
    measure: bool = True,
    log: Callable[[str], None] | None = None,
) -> Profile:
    """Profile the workload's model at every point of the mix; roofline and Amdahl per op.

    `peaks`: the device's measured peaks (default: measured or read from the cache when
    `measure`; without peaks the roofline columns stay empty).
    """
    torch = import_torch()
    if workload.threads:
        torch.set_num_threads(workload.threads)
    module = load_model_module(workload.model_path)
    device = workload.device
    on_device = device.startswith("cuda")
    if on_device and not torch.cuda.is_available():
        raise UserError(f"the workload says device = {device!r}, but torch sees no CUDA device here: profile on the GPU machine, or say device = \"cpu\"")
    try:
        model = module.build_model(workload.dtype, device)
    except Exception as exc:
        raise UserError(f"{workload.model_path}: build_model({workload.dtype!r}, {device!r}) raised {type(exc).__name__}: {exc}") from None
    if workload.mode is Mode.COMPILE:
        model = torch.compile(model, backend=workload.compile_backend)
    if peaks is None and measure:
        peaks = measure_peaks(device if on_device else "cpu")
    rng = np.random.default_rng(0)
    weights = workload.weights()
    rows: dict[tuple[str, str], list[ShapeRecord]] = defaultdict(list)
    kinds: dict[str, str] = {}
    flops_of: dict[tuple[str, str], float] = defaultdict(float)
    model_time = ops_time = unprofiled = 0.0
    per_point = []
    sync = torch.cuda.synchronize if on_device else (lambda: None)
    for point, weight in zip(workload.points, weights, strict=True):
        label_of = point_label(point)
        inputs = _to_device(module.make_inputs(dict(point), workload.dtype, rng), device, torch)
        with torch.no_grad(), _no_gc():
            for _ in range(workload.warmup):
                model(*inputs)
            sync()
            run = _graphed(torch, model, inputs) if workload.mode is Mode.CUDA_GRAPHS else functools.partial(model, *inputs)
            plain_runs: list[tuple[int, float]] = []
            for _ in range(workload.steps):
                switched, t0 = _preemptions(), time.perf_counter()
                run()
                sync()
                plain_runs.append((_preemptions() - switched, time.perf_counter() - t0))
            # of the forwards preempted least: on a device the fastest, as for the
            # profiled ones; on CPU their median, beside the profiled pieces' medians
            least = [t for n, t in plain_runs if n == min(plain_runs)[0]]
            plain = min(least) if on_device else statistics.median(least)
            compiled = workload.mode is Mode.COMPILE
            label = range_of(torch, compiled)
            with labelled_ops(module, torch, compiled):
                # a first profiled forward, thrown away: the profiler's start-up (its
                # first session, each new record's set-up) stays out of the records
                with _profiler(torch, on_device, record_shapes=True, with_flops=True), label(FORWARD):
                    model(*inputs)
                # the records: what each operator is called on (shapes, dtypes, FLOPs)
                with _profiler(torch, on_device, record_shapes=True, with_flops=True) as records:
                    with label(FORWARD):
                        model(*inputs)
                    sync()
                # the times: the same forwards without shapes and FLOPs, whose recording
                # cost is inside every operator with nested events
                preempted = []
                with _profiler(torch, on_device) as timed:
                    for _ in range(workload.steps):
                        switched = _preemptions()
                        with label(FORWARD):
                            model(*inputs)
                        sync()
                        preempted.append(_preemptions() - switched)
        recorded = _top_level(min(_forwards(records), key=lambda e: _span_s(e, on_device)))
        timed_forwards = sorted(_forwards(timed), key=lambda e: e.time_range.start)
        times, step_s, used = _op_times(recorded, list(zip(preempted, timed_forwards, strict=True)), on_device)
        if not used:  # the model called other operators each time: the records' own times
            times = [_span_s(e, on_device) for e in recorded]
            step_s = min(_span_s(e, False) for e in _forwards(records))
            if log:
                log(f"{label_of}: the timed forwards called other operators than the recorded one; "
                    "times from the recorded forward (with the profiler's recording cost in them)")
        if on_device:  # the forward's span on the host is not its device time: the wall clock is
            step_s = max(step_s, plain)
        covered = 0.0
        for event, spent in zip(recorded, times, strict=True):
            name = event.name
            is_model = name.startswith(PREFIX)
            op = name.removeprefix(PREFIX) if is_model else name
            kinds[op] = "model" if is_model else "aten"
            shapes, dtypes = _first_shapes(event) if is_model else ([list(s) for s in event.input_shapes or []], list(getattr(event, "input_dtypes", None) or []))
            dims = next((s for s in shapes if s), [])
            named = shape_of(module, op, dims) if is_model else row_shape(dims)
            covered += spent
            # the dtypes of the tensor inputs (a scalar argument has no shape)
            tensor_dtypes = [_torch_dtype(d) for d, dims_i in zip(dtypes, shapes, strict=False) if d and dims_i]
            record = ShapeRecord(
                shape=named, input_shapes=shapes, dtypes=tensor_dtypes,
                calls=weight, time_s=spent * weight, share=0.0, points=[label_of],
            )
            rows[(op, repr((shapes, record.dtypes)))].append(record)
            flops_of[(op, repr((shapes, record.dtypes)))] += _flops(event) * weight
        model_time += weight * step_s
        ops_time += weight * covered
        unprofiled += weight * plain
        per_point.append({"point": dict(point), "label": label_of, "weight": weight, "time_s": step_s, "unprofiled_s": plain,
                          "coverage": covered / step_s if step_s else 0.0, "host_s": max(0.0, step_s - covered), "forwards": used})
        if log:
            log(f"{label_of}: {step_s * 1e3:.3f} ms per forward profiled ({plain * 1e3:.3f} ms without the profiler); "
                f"operators {covered / step_s * 100 if step_s else 0:.1f}% of it")
    ops = _op_records(rows, kinds, flops_of, workload, model_time, peaks)
    for op in ops:
        mark_holdout(op.shapes, workload.holdout_fraction)
    return Profile(
        workload=workload.to_dict(), device=peaks.device if peaks else device, model_time_s=model_time, ops_time_s=ops_time,
        ops=ops, model_time_unprofiled_s=unprofiled, per_point=per_point, peaks=peaks.to_dict() if peaks else None,
        versions=library_versions(),
    )


def _op_records(
    rows: Mapping[tuple[str, str], list[ShapeRecord]], kinds: Mapping[str, str], flops_of: Mapping[tuple[str, str], float],
    workload: Workload, model_time: float, peaks: Peaks | None,
) -> list[OpRecord]:
    by_op: dict[str, list[ShapeRecord]] = defaultdict(list)
    flops_op: dict[str, float] = defaultdict(float)
    for (op, key), records in rows.items():
        merged = group_shapes(records)
        by_op[op] += merged
        flops_op[op] += flops_of[(op, key)]
    ops = []
    for op, shapes in by_op.items():
        shapes = group_shapes(shapes)
        for s in shapes:
            s.share = s.time_s / model_time if model_time else 0.0
        record = OpRecord(
            name=op, kind=kinds[op], calls=sum(s.calls for s in shapes), time_s=sum(s.time_s for s in shapes),
            share=0.0, shapes=shapes,
        )
        record.share = record.time_s / model_time if model_time else 0.0
        _roofline(record, workload, peaks, flops_op[op])
        ops.append(record)
    return sorted(ops, key=lambda o: -o.time_s)


def _roofline(record: OpRecord, workload: Workload, peaks: Peaks | None, profiled_flops: float) -> None:
    """The op's floor on this device, its bottleneck class, and Amdahl's bound for the model."""
    spec = workload.ops.get(record.name)
    floor = 0.0
    worst: tuple[float, str] = (-1.0, "")
    total_flops = total_bytes = 0.0
    for s in record.shapes:
        dtype = s.dtypes[0] if s.dtypes else workload.dtype
        if spec is not None and (spec.flops is not None or spec.bytes is not None):
            flops = evaluate(spec.flops, s.shape, dtype) if spec.flops is not None else 0.0
            nbytes = evaluate(spec.bytes, s.shape, dtype) if spec.bytes is not None else 0.0
        else:
            flops = profiled_flops * (s.calls / record.calls) / s.calls if record.calls and s.calls else 0.0
            nbytes = _estimate_bytes(s.input_shapes, s.dtypes, workload.dtype)
        total_flops += flops * s.calls
        total_bytes += nbytes * s.calls
        if peaks is None or not s.calls:
            continue
        per_call = s.time_s / s.calls
        point = assess(per_call, flops, nbytes, peaks, dtype if dtype in peaks.flops else "float32")
        # no single kernel beats its own call cost: the per-call floor includes it
        floor += s.calls * max(point.t_min_s, peaks.overhead_s)
        if s.time_s > worst[0]:
            worst = (s.time_s, point.bound)
    record.flops, record.bytes = total_flops, total_bytes
    if peaks is None:
        return
    record.bound = worst[1]
    record.roofline_time_s = floor
    model_time = record.time_s / record.share if record.share else 0.0
    if model_time:
        # the time the op could save at its roofline floor; none when it is already there
        # (computed apart: model_time - t + t rounds below model_time, a speedup < 1)
        saving = max(0.0, record.time_s - floor)
        record.amdahl_speedup = model_time / (model_time - saving)


# -- what people and proposers read ---------------------------------------------------------


def table(profile: Profile, limit: int = 15) -> str:
    """The ranked table: operators by Amdahl bound (what the model would gain at most)."""
    head = f"{'operator':<26} {'kind':<5} {'share':>6} {'calls':>7} {'ms/fwd':>9} {'bound':<8} {'floor ms':>9} {'amdahl':>7} {'shapes':>6}"
    lines = [
        f"model time {profile.model_time_s * 1e3:.3f} ms per forward of the mix (profiled; "
        f"{(profile.model_time_unprofiled_s or 0) * 1e3:.3f} ms without the profiler); operators cover "
        f"{profile.coverage * 100:.1f}% of it, the rest is host time between them (Python, argument parsing); "
        f"device {profile.device}",
        head,
        "-" * len(head),
    ]
    ranked = sorted(profile.ops, key=lambda o: -(o.amdahl_speedup or 1.0 + o.share))
    for op in ranked[:limit]:
        floor = f"{op.roofline_time_s * 1e3:.4f}" if op.roofline_time_s is not None else "-"
        amdahl = f"{op.amdahl_speedup:.3f}x" if op.amdahl_speedup else "-"
        lines.append(
            f"{op.name[:26]:<26} {op.kind:<5} {op.share * 100:>5.1f}% {op.calls:>7.2f} {op.time_s * 1e3:>9.4f} "
            f"{op.bound or '-':<8} {floor:>9} {amdahl:>7} {len(op.shapes):>6}"
        )
    rest = len(ranked) - limit
    if rest > 0:
        lines.append(f"... {rest} more operators ({sum(o.share for o in ranked[limit:]) * 100:.1f}% of the time)")
    return "\n".join(lines)


def whats_left(profile: Profile, done: Sequence[str] = (), limit: int = 3) -> str:
    """The next operators worth a study, by Amdahl bound, leaving out those in `done`."""
    rest = sorted((o for o in profile.ops if o.name not in done and o.amdahl_speedup),
                  key=lambda o: -(o.amdahl_speedup or 1.0))[:limit]
    return "next by Amdahl bound: " + (", ".join(f"{o.name} ({o.share * 100:.1f}%, up to {o.amdahl_speedup:.3f}x)" for o in rest) or "none")


def model_markdown(profile: Profile, module_doc: str = "") -> str:
    """model.md for proposers: what the model computes, where the time goes, which shapes matter."""
    wl = profile.workload
    lines = ["# Model context", "", "Generated by `ratchet profile` from the model run under its declared workload.", ""]
    if module_doc:
        lines += ["## The model", "", module_doc.strip(), ""]
    lines += ["## How it is run", ""]
    lines.append(f"- device {wl['device']}, dtype {wl['dtype']}, mode {wl['mode']} (eager, cuda_graphs or compile)")
    for p in profile.per_point:
        lines.append(f"- {p['label']}: {p['weight'] * 100:.0f}% of forward passes, {p['unprofiled_s'] * 1e3:.3f} ms each")
    lines += ["", "## Where the time goes", "", "```", table(profile), "```", ""]
    lines += ["## Shapes that matter (swappable operators)", ""]
    for op in profile.ops:
        if op.kind != "model":
            continue
        lines += [f"### {op.name}: {op.share * 100:.1f}% of the model's time", "", "| shape | input shapes | dtype | calls/fwd | share |", "|---|---|---|---|---|"]
        for s in op.shapes:
            if s.holdout:
                continue  # the proposer never sees the hold-out shapes
            dims = ", ".join(f"{k}={v}" for k, v in s.shape.items())
            lines.append(f"| {dims} | {s.input_shapes} | {', '.join(s.dtypes)} | {s.calls:.2f} | {s.share * 100:.2f}% |")
        held = sum(1 for s in op.shapes if s.holdout)
        if held:
            lines.append(f"\n{held} larger shape(s) of {op.name} are held out: the kernel is judged on them too.")
        lines.append("")
    lines += ["## What must not change", "", "- the model's logits, within the end-to-end tolerance of the study", ""]
    return "\n".join(lines)


def write_profile(
    workload_path: str | Path,
    *,
    out: str | Path = "workload.json",
    holdout_dir: str | Path | None = None,
    model_md: str | Path | None = None,
    roofline: bool = True,
    log: Callable[[str], None] | None = None,
) -> tuple[Profile, list[str]]:
    """`ratchet profile`: profile, then write workload.json (and model.md); the lines to print.

    With `holdout_dir`, the full profile goes there (the study's hidden `holdout_data`,
    read by the hold-out evaluator only) and `out` gets the copy without hold-out shapes.
    """
    from .workload import redacted, save_profile  # noqa: PLC0415 - one import block per verb

    workload = Workload.load(workload_path)
    profile = profile_model(workload, measure=roofline, log=log)
    lines = [table(profile)]
    if holdout_dir is not None:
        full = save_profile(profile, Path(holdout_dir) / Path(out).name)
        public = save_profile(redacted(profile), out)
        lines.append(f"wrote {public} (without the hold-out shapes) and {full} (all shapes: keep it in the study's holdout_data)")
    else:
        lines.append(f"wrote {save_profile(profile, out)}")
    if model_md is not None:
        module = load_model_module(workload.model_path, name="ratchet_profiled_model_doc")
        Path(model_md).write_text(model_markdown(profile, module.__doc__ or ""))
        lines.append(f"wrote {model_md}")
    return profile, lines
