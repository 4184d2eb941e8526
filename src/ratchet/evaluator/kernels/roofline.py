"""The physics floor and the bottleneck: measured peaks, % of roofline, impossible times.

T_min = max(FLOPs / peak_FLOPs, bytes / peak_bandwidth) is the fastest any kernel can
run a shape on this machine. A measured time well below it (default: under half) is a
bug or a cheat (work skipped, done off the timed path, not captured in a CUDA graph)
and is rejected. Above it, the ratio says how much headroom is left, and which roof
(compute, memory, or fixed call/launch overhead) is the one to push on.

Peaks are *measured* here (a large copy for bandwidth, a large matmul per dtype for
FLOP/s, a tiny call for overhead), once per device, and cached as JSON keyed by device
name, because datasheet numbers are rarely reached and vary by SKU, clocks and BLAS.
"""

from __future__ import annotations

import ast
import importlib
import json
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from . import arrays, guard, quiesce
from .hardware import cpu_info, hardware_context, hardware_markdown, library_versions, llc_bytes

ITEMSIZE = {
    "float64": 8,
    "float32": 4,
    "tf32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}


@dataclass
class Peaks:
    """What this device can do at best, as measured."""

    device: str
    bandwidth_Bps: float
    flops: dict[str, float]
    overhead_s: float
    measured_at: str = ""
    method: str = ""
    versions: dict[str, str] = field(default_factory=dict)

    def peak_flops(self, dtype: str) -> float:
        """Peak for `dtype`; the highest measured one when `dtype` was not measured.

        The highest is the generous choice: it lowers the floor, so an honest kernel in an
        unmeasured dtype is never called impossible.
        """
        if dtype in self.flops:
            return self.flops[dtype]
        return max(self.flops.values()) if self.flops else math.inf

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Peaks:
        return cls(
            device=d["device"],
            bandwidth_Bps=float(d["bandwidth_Bps"]),
            flops={k: float(v) for k, v in d.get("flops", {}).items()},
            overhead_s=float(d.get("overhead_s", 0.0)),
            measured_at=d.get("measured_at", ""),
            method=d.get("method", ""),
            versions=dict(d.get("versions", {})),
        )


# ---------------------------------------------------------------------------------------
# Cache


def cache_dir() -> Path:
    """$RATCHET_CACHE, else ~/.cache/ratchet."""
    root = os.environ.get("RATCHET_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "ratchet"


def peaks_cache_path(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path) if path else cache_dir() / "peaks.json"


def _read_cache(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {"format": 1, "devices": {}}
    if not isinstance(data, dict) or not isinstance(data.get("devices"), dict):
        return {"format": 1, "devices": {}}
    return data


def load_peaks(device: str | None = None, cache_path: str | os.PathLike[str] | None = None) -> Peaks | None:
    """Cached peaks for `device` (default: this CPU), or None."""
    name = device or device_name("cpu")
    entry = _read_cache(peaks_cache_path(cache_path))["devices"].get(name)
    return Peaks.from_dict(entry) if entry else None


def cached_peaks(cache_path: str | os.PathLike[str] | None = None) -> list[Peaks]:
    """Every device's cached peaks."""
    return [Peaks.from_dict(v) for v in _read_cache(peaks_cache_path(cache_path))["devices"].values()]


def save_peaks(peaks: Peaks, cache_path: str | os.PathLike[str] | None = None) -> Path:
    """Write (or replace) one device's entry; atomic rename so readers never see half a file."""
    path = peaks_cache_path(cache_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = _read_cache(path)
    data["devices"][peaks.device] = peaks.to_dict()
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------------------------
# Measuring


def device_name(device: str = "cpu") -> str:
    """The cache key: 'cpu: <model> x<cpus> [cpus <list>]' or 'cuda: <GPU name>'.

    On CPU the key includes the affinity set when it is not the whole machine: a slot
    pinned to 2 cores has other peaks than the whole machine, and must not share them.
    """
    if device.startswith("cuda"):
        # imported only here, when the caller asks for CUDA
        torch = arrays.torch_module() or importlib.import_module("torch")
        index = int(device.split(":")[1]) if ":" in device else torch.cuda.current_device()
        return f"cuda: {torch.cuda.get_device_name(index)}"
    info = cpu_info()
    name = f"cpu: {info.get('model')} x{info.get('usable_cpus', info.get('logical_cpus'))}"
    if hasattr(os, "sched_getaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) != (os.cpu_count() or len(cpus)):
            name += " cpus " + ",".join(str(c) for c in cpus)
    return name


def _best(fn: Callable[[], object], reps: int) -> float:
    """Fastest of `reps` timed calls: peaks are about what is possible, so the minimum."""
    perf = guard._CLOCK
    best = math.inf
    for _ in range(reps):
        t0 = perf()
        fn()
        best = min(best, perf() - t0)
    return best


def _cpu_bandwidth(nbytes: int, reps: int, rounds: int = 3) -> float:
    """Copy bandwidth (bytes read + written per second), best of one thread and all cores.

    Measured in `rounds` rounds a little apart and the best kept: on a shared machine one
    round can see a third of the real bandwidth, and a low peak would make an honest
    library call look faster than physics allows.
    """
    best = 0.0
    for i in range(rounds):
        if i:
            time.sleep(0.05)
        best = max(best, _cpu_bandwidth_once(nbytes, reps))
    return best


def _cpu_bandwidth_once(nbytes: int, reps: int) -> float:
    n = nbytes // 8
    src = np.full(n, 1.0)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in before timing
    single = 2 * src.nbytes / _best(lambda: np.copyto(dst, src), reps)
    workers = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if workers < 2:
        return single
    bounds = np.linspace(0, n, workers + 1).astype(int)

    def parallel_copy() -> None:
        threads = [
            threading.Thread(target=np.copyto, args=(dst[bounds[i] : bounds[i + 1]], src[bounds[i] : bounds[i + 1]]))
            for i in range(workers)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    multi = 2 * src.nbytes / _best(parallel_copy, reps)
    return max(single, multi)


def _cpu_flops(dtype: str, n: int, reps: int) -> float:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, n)).astype(dtype)
    c = np.empty((n, n), dtype=dtype)
    np.matmul(a, b, out=c)  # warm-up: BLAS thread pool start, page faults
    return 2.0 * n**3 / _best(lambda: np.matmul(a, b, out=c), reps)


def _cpu_overhead(calls: int = 2000) -> float:
    """Median cost of one trivial numpy call: the fixed price of a Python-level kernel."""
    a = np.ones(1)
    b = np.empty(1)
    perf = guard._CLOCK
    samples = []
    for _ in range(calls):
        t0 = perf()
        np.add(a, 1.0, out=b)
        samples.append(perf() - t0)
    return float(np.median(samples))


def _cuda_peaks(device: str, dtypes: Sequence[str], budget_bytes: int) -> tuple[float, dict[str, float], float]:
    torch = arrays.loaded_torch()
    dev = torch.device(device)
    event = torch.cuda.Event

    def best_ms(fn: Callable[[], object], reps: int) -> float:
        fn()
        torch.cuda.synchronize(dev)
        best = math.inf
        for _ in range(reps):
            start, end = event(enable_timing=True), event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize(dev)
            best = min(best, start.elapsed_time(end))
        return best / 1e3

    n = budget_bytes // 4
    src = torch.ones(n, dtype=torch.float32, device=dev)
    dst = torch.empty_like(src)
    bandwidth = 2 * n * 4 / best_ms(lambda: dst.copy_(src), 10)
    flops = {}
    for dtype in dtypes:
        tf32 = dtype == "tf32"
        tdtype = getattr(torch, "float32" if tf32 else dtype)
        size = 4096 if dtype in ("float32", "tf32", "float64") else 8192
        a = torch.randn(size, size, device=dev).to(tdtype)
        b = torch.randn(size, size, device=dev).to(tdtype)
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        try:
            flops[dtype] = 2.0 * size**3 / best_ms(partial(torch.matmul, a, b), 5)
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        del a, b
    tiny = torch.ones(1, device=dev)
    launches = 200

    def many() -> None:
        for _ in range(launches):
            tiny.add_(1.0)

    overhead = best_ms(many, 5) / launches
    return bandwidth, flops, overhead


def measure_peaks(
    device: str = "cpu",
    *,
    dtypes: Sequence[str] | None = None,
    cache_path: str | os.PathLike[str] | None = None,
    refresh: bool = False,
    copy_bytes: int | None = None,
    matmul_n: int = 1024,
    reps: int = 5,
    rounds: int = 3,
) -> Peaks:
    """Measure (or load from the cache) bandwidth, FLOP/s per dtype and call overhead.

    CPU: numpy copy of `copy_bytes` (default 4x the last-level cache, at least 64 MiB),
    numpy matmul of n x n per dtype. CUDA (torch): tensor copy, torch.matmul per dtype
    (tf32 measured as its own dtype), back-to-back tiny kernels for launch overhead.
    """
    name = device_name(device)
    cached = load_peaks(name, cache_path)
    if cached is not None and not refresh:
        return cached
    if device.startswith("cuda"):
        dtypes = tuple(dtypes or ("float32", "tf32", "float16", "bfloat16"))
        bandwidth, flops, overhead = _cuda_peaks(device, dtypes, copy_bytes or (1 << 30))
        method = "torch copy_ of 2 x copy_bytes; torch.matmul 4096^2 (fp32/tf32) or 8192^2; 200 tiny launches"
    else:
        dtypes = tuple(dtypes or ("float32", "float64"))
        size = copy_bytes or max(4 * llc_bytes(), 64 << 20)
        bandwidth = _cpu_bandwidth(size, reps, rounds)
        flops = {d: max(_cpu_flops(d, matmul_n, reps) for _ in range(max(1, rounds))) for d in dtypes}
        quiesce.settle()  # the matmuls' BLAS threads spin ~0.1 s: not during the next measurement
        overhead = _cpu_overhead()
        method = f"numpy copyto {size >> 20} MiB (1 and all threads), matmul {matmul_n}^2, trivial ufunc call"
    peaks = Peaks(
        device=name,
        bandwidth_Bps=bandwidth,
        flops=flops,
        overhead_s=overhead,
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
        method=method,
        versions=library_versions(),
    )
    if cached is not None:  # a re-measure never lowers a peak already seen on this device
        peaks.bandwidth_Bps = max(peaks.bandwidth_Bps, cached.bandwidth_Bps)
        peaks.flops = {d: max(v, cached.flops.get(d, 0.0)) for d, v in {**cached.flops, **peaks.flops}.items()}
        peaks.overhead_s = min(peaks.overhead_s, cached.overhead_s) if cached.overhead_s > 0 else peaks.overhead_s
    try:
        save_peaks(peaks, cache_path)
    except OSError as exc:  # a sandboxed evaluator may see a read-only cache: measure, don't fail
        print(f"ratchet.evaluator.kernels: peaks not cached ({exc}); pre-measure them where the cache is writable", file=sys.stderr)
    return peaks


# ---------------------------------------------------------------------------------------
# Formulas: FLOPs and bytes per shape


_FUNCS: dict[str, Callable[..., float]] = {
    "min": min,
    "max": max,
    "log2": math.log2,
    "log": math.log,
    "sqrt": math.sqrt,
    "ceil": math.ceil,
    "floor": math.floor,
}
_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.Mod: lambda a, b: a % b,
    ast.Pow: lambda a, b: a**b,
}


def evaluate(formula: str | float | int | Callable[[Mapping[str, Any]], float], shape: Mapping[str, Any], dtype: str = "float32") -> float:
    """FLOPs or bytes of one shape from a number, a callable(shape) or a formula string.

    Strings may use the shape's names, `itemsize` (bytes per element of `dtype`) and
    min/max/log2/log/sqrt/ceil/floor; nothing else (no attribute access, no calls out).
    Example: "2 * rows * cols * itemsize".
    """
    if callable(formula):
        return float(formula(shape))
    if isinstance(formula, int | float):
        return float(formula)
    names = {**{k: v for k, v in shape.items() if isinstance(v, int | float)}, "itemsize": ITEMSIZE.get(dtype, 4)}

    def walk(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return node.value
        if isinstance(node, ast.Name):
            if node.id not in names:
                raise ValueError(f"unknown name {node.id!r} in formula {formula!r} (have {sorted(names)})")
            return names[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return _BINOPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = walk(node.operand)
            return -value if isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _FUNCS and not node.keywords:
            return _FUNCS[node.func.id](*(walk(a) for a in node.args))
        raise ValueError(f"formula {formula!r}: {ast.dump(node)[:60]} is not allowed")

    return float(walk(ast.parse(str(formula), mode="eval")))


# ---------------------------------------------------------------------------------------
# Assessing one measured time


@dataclass
class RooflinePoint:
    """One shape's measured time against this device's roofs."""

    time_s: float
    flops: float
    bytes: float
    t_compute_s: float
    t_memory_s: float
    t_min_s: float
    pct_of_bound: float
    intensity: float  # FLOPs per byte
    bound: str  # "compute" | "memory" | "overhead"
    impossible: bool
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return arrays.jsonable(asdict(self))


def default_floor_fraction(peaks: Peaks) -> float:
    """GPU: a time above ~110% of the measured roofline is impossible. CPU: above 200%.

    GPU peaks (a large device copy, a large matmul) are measured the way the standard
    tools measure them and are stable, so a kernel cannot beat them by more than noise.
    CPU peaks move with load, frequency and which cores a slot got, so the CPU floor
    keeps a wide margin: an honest library call must never be called impossible.
    """
    return 1 / 1.1 if peaks.device.startswith("cuda") else 0.5


def assess(
    time_s: float,
    flops: float,
    nbytes: float,
    peaks: Peaks,
    dtype: str = "float32",
    *,
    floor_fraction: float | None = None,
    overhead_factor: float = 1.0,
) -> RooflinePoint:
    """Classify a time and reject it if it beats physics.

    impossible: time < floor_fraction x T_min (see `default_floor_fraction`).
    overhead-bound: the roofline minimum is below `overhead_factor` x the fixed cost of
    one call/launch: whatever the kernel does, its time is mostly that fixed cost.
    Otherwise compute- or memory-bound by which roof is higher (arithmetic intensity vs
    the ridge point).
    """
    if floor_fraction is None:
        floor_fraction = default_floor_fraction(peaks)
    t_compute = flops / peaks.peak_flops(dtype) if flops else 0.0
    t_memory = nbytes / peaks.bandwidth_Bps if nbytes else 0.0
    t_min = max(t_compute, t_memory)
    pct = 100.0 * t_min / time_s if time_s > 0 else math.inf
    intensity = flops / nbytes if nbytes else math.inf
    if t_min < overhead_factor * peaks.overhead_s:
        bound = "overhead"
    else:
        bound = "compute" if t_compute >= t_memory else "memory"
    impossible = time_s < floor_fraction * t_min
    reason = ""
    if impossible:
        roof = "compute" if t_compute >= t_memory else "memory"
        reason = (
            f"measured {time_s * 1e3:.4g} ms is {pct:.0f}% of the {roof} roofline (minimum {t_min * 1e3:.4g} ms "
            f"for {flops:.3g} FLOP, {nbytes:.3g} B on {peaks.device}; limit {100 / floor_fraction:.0f}%): "
            "impossible, so work was skipped, done off the timed path or not measured"
        )
    return RooflinePoint(
        time_s=time_s,
        flops=flops,
        bytes=nbytes,
        t_compute_s=t_compute,
        t_memory_s=t_memory,
        t_min_s=t_min,
        pct_of_bound=pct,
        intensity=intensity,
        bound=bound,
        impossible=impossible,
        reason=reason,
    )


def write_hardware_md(path: str | os.PathLike[str] = "hardware.md", *, cache_path: str | os.PathLike[str] | None = None) -> Path:
    """Write hardware.md, including every cached peak measurement (see measure_peaks): here,
    beside the peaks, as hardware.py (which this module reads) knows nothing of them."""
    peaks = [p.to_dict() for p in cached_peaks(cache_path)]
    out = Path(path)
    # run by hand on the GPU machine: the richest facts are worth torch's import here
    out.write_text(hardware_markdown(hardware_context(use_torch=True), peaks=peaks))
    return out
