"""Honest timing: `bench()` for one function, `compare()` for two, interleaved.

The rules, each from a way published kernel timings went wrong:
- warm-up calls first, so JIT compilation, autotuning and module loading stay out;
- repeat until the standard error of the mean is under `target_sem` (1%) or a time cap;
  report the median and IQR (robust to the odd preempted sample), not the minimum;
- decide warm vs cold cache on purpose (`cache=`): "flush" writes a buffer larger than
  the last-level cache before every call, "rotate" cycles through enough input sets
  that together exceed it, "warm" does neither and says so in the result;
- inputs are touched (one element changed) between calls, outside the timed region,
  so a result cache keyed on input content misses;
- on CUDA: device events *and* a device-wide synchronize, with a host wall clock around
  the same region as a cross-check (events on one stream miss work on other streams);
  optional CUDA-graph replay for launch-bound kernels;
- the clock is the one captured when the harness was imported (guard.py) and the
  timers are verified after the run; a patched timer makes the result untrusted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import numpy as np

from . import arrays, guard
from .hardware import llc_bytes

CacheMode = Literal["flush", "rotate", "warm"]
Inputs = Sequence[Any]


@dataclass
class BenchResult:
    """Per-call times of one function and the statistics a judge needs."""

    name: str
    times_s: list[float]
    median_s: float
    iqr_s: float
    mean_s: float
    sem_rel: float
    reps: int
    inner: int
    warmup: int
    converged: bool
    cache: str
    device: str
    timer: str
    host_median_s: float | None = None
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def time_ms(self) -> float:
        return self.median_s * 1e3

    def summary(self) -> str:
        status = "ok" if self.ok else "UNTRUSTED: " + "; ".join(self.reasons)
        return (
            f"{self.name}: median {self.median_s * 1e3:.4f} ms, IQR {self.iqr_s * 1e3:.4f} ms, "
            f"sem {self.sem_rel * 100:.2f}% over {self.reps} reps ({self.cache}, {self.timer}) {status}"
        )

    def to_dict(self, with_samples: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_samples:
            d.pop("times_s")
        d["ok"] = self.ok
        return arrays.jsonable(d)


@dataclass
class CompareResult:
    """A vs B measured in alternating order (ABBA...), so drift hits both equally."""

    a: BenchResult
    b: BenchResult
    speedup: float  # median(a) / median(b): > 1 means b is faster
    ratio_median: float  # median over pairs of time_b / time_a
    ratio_q25: float
    ratio_q75: float

    @property
    def ok(self) -> bool:
        return self.a.ok and self.b.ok

    @property
    def significant(self) -> bool:
        """The middle half of paired ratios lies entirely on one side of 1."""
        return self.ratio_q75 < 1.0 or self.ratio_q25 > 1.0

    def to_dict(self) -> dict[str, Any]:
        return arrays.jsonable({
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "speedup": self.speedup,
            "ratio_median": self.ratio_median,
            "ratio_q25": self.ratio_q25,
            "ratio_q75": self.ratio_q75,
            "significant": self.significant,
            "ok": self.ok,
        })


def capture_timers() -> list[str]:
    """Capture torch's timers too; call after ``import torch`` and before importing the candidate."""
    return guard.capture_timers()


def verify_timers() -> list[str]:
    """Reasons the timers or comparison functions were tampered with (empty if not)."""
    return guard.verify_timers()


# ---------------------------------------------------------------------------------------
# Preparation between calls: input sets, cache flush, touching inputs


class _Preparer:
    """Owns the input sets and the flush buffer; `before(i)` returns the args for call i."""

    def __init__(
        self,
        sets: list[tuple[Any, ...]],
        cache: CacheMode,
        flush_bytes: int | None,
        touch: bool,
        seed: int,
    ) -> None:
        self.sets = sets
        self.cache = cache
        self.touch = touch
        self.rng = np.random.default_rng(seed)
        self.flush_buf: Any = None
        first = sets[0]
        self.torch_device = next((a.device for a in first if arrays.is_torch(a) and a.is_cuda), None)
        if cache == "flush":
            size = int(flush_bytes or 2 * self._cache_bytes())
            if self.torch_device is not None:
                torch = arrays.torch_module()
                self.flush_buf = torch.empty(size // 4, dtype=torch.float32, device=self.torch_device)
            else:
                self.flush_buf = np.empty(size // 8, dtype=np.float64)
        self.flush_bytes = size if cache == "flush" else 0
        self._counter = 0

    def _cache_bytes(self) -> int:
        if self.torch_device is not None:
            torch = arrays.torch_module()
            props = torch.cuda.get_device_properties(self.torch_device)
            return int(getattr(props, "L2_cache_size", 0) or (64 << 20))
        return llc_bytes()

    def describe(self) -> str:
        if self.cache == "flush":
            return f"flush {self.flush_bytes >> 20} MiB"
        if self.cache == "rotate":
            return f"rotate {len(self.sets)} sets"
        return "warm"

    def before(self, i: int) -> tuple[Any, ...]:
        args = self.sets[i % len(self.sets)]
        if self.touch:
            for a in args:
                arrays.touch_(a, self.rng)
        if self.flush_buf is not None:
            self._counter += 1
            if arrays.is_torch(self.flush_buf):
                self.flush_buf.fill_(float(self._counter))
            else:
                self.flush_buf.fill(float(self._counter))
        return args


def make_sets(
    inputs: Inputs | None,
    make_inputs: Callable[[], Any] | None,
    cache: CacheMode,
    sets: int | None,
) -> list[tuple[Any, ...]]:
    """The input sets to cycle through.

    For cache="rotate" without an explicit count, enough sets that together they are
    larger than twice the last-level cache (so each call starts cold), capped at 64.
    """
    if (inputs is None) == (make_inputs is None):
        raise ValueError("give exactly one of inputs= or make_inputs=")
    if inputs is not None:
        if cache == "rotate" and (sets or 1) > 1:
            raise ValueError("cache='rotate' needs make_inputs= to build several input sets")
        return [arrays.as_tuple(inputs)]
    first = arrays.as_tuple(make_inputs())
    count = sets or 1
    if cache == "rotate" and sets is None:
        size = sum(arrays.nbytes(a) for a in first) or 1
        on_gpu = any(arrays.is_torch(a) and a.is_cuda for a in first)
        target = 2 * (64 << 20 if on_gpu else llc_bytes())
        count = min(64, max(2, math.ceil(target / size)))
    out = [first]
    while len(out) < count:
        out.append(arrays.as_tuple(make_inputs()))
    return out


# ---------------------------------------------------------------------------------------
# One timed call, on CPU or CUDA


class _Clock:
    """Times `fn(*args)` `inner` times; returns (seconds per call, host seconds per call)."""

    def __init__(self, args: tuple[Any, ...], cuda_graph: bool) -> None:
        self.perf = guard._CLOCK
        self.cuda = any(arrays.is_torch(a) and a.is_cuda for a in args)
        self.cuda_graph = cuda_graph
        if cuda_graph and not self.cuda:
            raise ValueError("cuda_graph=True needs CUDA tensors among the inputs")
        self.graphs: dict[int, Any] = {}
        if self.cuda:
            torch = arrays.torch_module()
            event = guard.ORIGINALS.get("torch.cuda.Event", torch.cuda.Event)
            self.sync = guard.ORIGINALS.get("torch.cuda.synchronize", torch.cuda.synchronize)
            self.start = event(enable_timing=True)
            self.end = event(enable_timing=True)

    @property
    def name(self) -> str:
        if self.cuda_graph:
            return "cuda_graph+events"
        return "cuda_events+sync" if self.cuda else "perf_counter"

    def capture(self, fn: Callable[..., Any], args: tuple[Any, ...], key: int, inner: int) -> None:
        """Record `inner` calls of fn on args into a CUDA graph (after a side-stream warm-up)."""
        torch = arrays.torch_module()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):
                fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(inner):
                fn(*args)
        self.sync()
        self.graphs[key] = graph

    def time(self, fn: Callable[..., Any], args: tuple[Any, ...], inner: int, key: int = 0) -> tuple[float, float]:
        perf = self.perf
        if not self.cuda:
            t0 = perf()
            for _ in range(inner):
                fn(*args)
            t1 = perf()
            return (t1 - t0) / inner, (t1 - t0) / inner
        self.sync()
        h0 = perf()
        self.start.record()
        if self.cuda_graph:
            self.graphs[key].replay()
        else:
            for _ in range(inner):
                fn(*args)
        self.end.record()
        self.sync()  # device-wide: work a candidate put on another stream is waited for too
        h1 = perf()
        return self.start.elapsed_time(self.end) / 1e3 / inner, (h1 - h0) / inner


def _calibrate_inner(clock: _Clock, fn: Callable[..., Any], args: tuple[Any, ...], cache: CacheMode) -> int:
    """Calls per sample: 1, unless one call is too short to time well and no flush is wanted.

    With a cache flush every call must start cold, so it is always 1.
    """
    if cache == "flush" or clock.cuda_graph:
        return 1
    t, _ = clock.time(fn, args, 1)
    floor = 20e-6 if clock.cuda else 50e-6
    if t >= floor:
        return 1
    return int(min(1000, math.ceil(floor / max(t, 1e-8))))


class _Welford:
    """Running mean/variance, so the stop rule costs O(1) per sample."""

    def __init__(self) -> None:
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)

    def sem_rel(self) -> float:
        if self.n < 2 or self.mean <= 0:
            return math.inf
        return math.sqrt(self.m2 / (self.n - 1) / self.n) / self.mean


def _stats(samples: list[float]) -> tuple[float, float, float]:
    a = np.asarray(samples, dtype=np.float64)
    q25, q50, q75 = np.percentile(a, [25, 50, 75])
    return float(q50), float(q75 - q25), float(a.mean())


def _cross_check(name: str, samples: list[float], host: list[float], clock: _Clock, host_total: float, wall_total: float) -> list[str]:
    """Reasons the measured times disagree with the host wall clock."""
    reasons = []
    if clock.cuda:
        ev, hm = float(np.median(samples)), float(np.median(host))
        # Host time includes launch and sync latency (tens of us); events far below the
        # synchronized host time mean the work ran somewhere the events did not see.
        if hm - ev > max(100e-6, 1.0 * ev) and ev < 0.5 * hm:
            reasons.append(
                f"{name}: device events ({ev * 1e3:.4f} ms) miss most of the synchronized host time "
                f"({hm * 1e3:.4f} ms): work on another stream or a background thread?"
            )
    elif host_total > wall_total * 1.05 + 1e-3:
        reasons.append(f"{name}: timed samples add up to more than the elapsed wall time: clock is wrong")
    return reasons


def bench(
    fn: Callable[..., Any],
    inputs: Inputs | None = None,
    *,
    make_inputs: Callable[[], Any] | None = None,
    cache: CacheMode = "flush",
    sets: int | None = None,
    flush_bytes: int | None = None,
    warmup: int = 3,
    min_reps: int = 10,
    max_reps: int = 10_000,
    max_time_s: float = 2.0,
    target_sem: float = 0.01,
    touch: bool = True,
    cuda_graph: bool = False,
    inner: int | None = None,
    name: str | None = None,
    seed: int = 0,
) -> BenchResult:
    """Time `fn(*inputs)`.

    Give `inputs` (one set, reused) or `make_inputs()` (called to build `sets` sets, or
    enough to exceed the LLC when cache="rotate"). `cache` chooses cold ("flush" or
    "rotate") or "warm" timing explicitly. Stops when the relative standard error of the
    mean is below `target_sem` after `min_reps`, or after `max_time_s` / `max_reps`.
    """
    input_sets = make_sets(inputs, make_inputs, cache, sets)
    prep = _Preparer(input_sets, cache, flush_bytes, touch, seed)
    clock = _Clock(input_sets[0], cuda_graph)
    label = name or getattr(fn, "__name__", "fn")
    for i in range(warmup):
        fn(*prep.before(i))
    arrays.synchronize(input_sets[0])
    n_inner = inner or _calibrate_inner(clock, fn, input_sets[0], cache)
    if cuda_graph:
        for k, args in enumerate(input_sets):
            clock.capture(fn, args, k, n_inner)
    samples: list[float] = []
    host: list[float] = []
    running = _Welford()
    perf = guard._CLOCK
    started = perf()
    rep = 0
    while rep < max_reps:
        args = prep.before(rep)
        t, h = clock.time(fn, args, n_inner, rep % len(input_sets))
        samples.append(t)
        host.append(h)
        running.add(t)
        rep += 1
        if rep >= min_reps and (running.sem_rel() < target_sem or perf() - started > max_time_s):
            break
    wall = perf() - started
    return _result(label, samples, host, n_inner, warmup, running.sem_rel(), target_sem, prep, clock, wall)


def _result(
    label: str,
    samples: list[float],
    host: list[float],
    inner: int,
    warmup: int,
    sem: float,
    target_sem: float,
    prep: _Preparer,
    clock: _Clock,
    wall: float,
) -> BenchResult:
    median, iqr, mean = _stats(samples)
    reasons = [f"{label}: {p}" for p in verify_timers()]
    reasons += _cross_check(label, samples, host, clock, float(np.sum(host)) * inner, wall)
    if median <= 0:
        reasons.append(f"{label}: measured a non-positive time ({median!r} s)")
    return BenchResult(
        name=label,
        times_s=samples,
        median_s=median,
        iqr_s=iqr,
        mean_s=mean,
        sem_rel=sem,
        reps=len(samples),
        inner=inner,
        warmup=warmup,
        converged=sem < target_sem,
        cache=prep.describe(),
        device="cuda" if clock.cuda else "cpu",
        timer=clock.name,
        host_median_s=float(np.median(host)) if clock.cuda else None,
        reasons=reasons,
    )


def compare(
    a: Callable[..., Any],
    b: Callable[..., Any],
    inputs: Inputs | None = None,
    *,
    make_inputs: Callable[[], Any] | None = None,
    cache: CacheMode = "flush",
    sets: int | None = None,
    flush_bytes: int | None = None,
    warmup: int = 3,
    min_reps: int = 10,
    max_reps: int = 10_000,
    max_time_s: float = 4.0,
    target_sem: float = 0.01,
    touch: bool = True,
    cuda_graph: bool = False,
    names: tuple[str, str] | None = None,
    seed: int = 0,
) -> CompareResult:
    """Time a and b on the same inputs, alternating ABBA, until both means are tight.

    Interleaving means a thermal ramp, a noisy neighbour or frequency scaling hits both
    sides alike; the paired ratio time_b / time_a is then far steadier than either time.
    """
    input_sets = make_sets(inputs, make_inputs, cache, sets)
    prep = _Preparer(input_sets, cache, flush_bytes, touch, seed)
    clock = _Clock(input_sets[0], cuda_graph)
    label_a, label_b = names or (getattr(a, "__name__", "a"), getattr(b, "__name__", "b"))
    for i in range(warmup):
        a(*prep.before(i))
        b(*prep.before(i))
    arrays.synchronize(input_sets[0])
    inner_a = _calibrate_inner(clock, a, input_sets[0], cache)
    inner_b = _calibrate_inner(clock, b, input_sets[0], cache)
    n_inner = max(inner_a, inner_b)  # the same count on both sides keeps the pairing fair
    clock_a = clock
    clock_b = _Clock(input_sets[0], cuda_graph) if cuda_graph else clock  # one graph set per side
    if cuda_graph:
        for k, args in enumerate(input_sets):
            clock_a.capture(a, args, k, n_inner)
            clock_b.capture(b, args, k, n_inner)
    ta: list[float] = []
    tb: list[float] = []
    ha: list[float] = []
    hb: list[float] = []
    wa, wb, ratio = _Welford(), _Welford(), _Welford()
    perf = guard._CLOCK
    started = perf()
    rep = 0
    while rep < max_reps:
        order = ((a, clock_a, ta, ha, wa), (b, clock_b, tb, hb, wb))
        if rep % 2:
            order = order[::-1]
        for fn, clk, times, hosts, stat in order:
            args = prep.before(rep)
            t, h = clk.time(fn, args, n_inner, rep % len(input_sets))
            times.append(t)
            hosts.append(h)
            stat.add(t)
        ratio.add(tb[-1] / ta[-1] if ta[-1] > 0 else math.inf)
        rep += 1
        tight = wa.sem_rel() < target_sem and wb.sem_rel() < target_sem or ratio.sem_rel() < target_sem / 2
        if rep >= min_reps and (tight or perf() - started > max_time_s):
            break
    wall = perf() - started
    ra = _result(label_a, ta, ha, n_inner, warmup, wa.sem_rel(), target_sem, prep, clock_a, wall)
    rb = _result(label_b, tb, hb, n_inner, warmup, wb.sem_rel(), target_sem, prep, clock_b, wall)
    ratios = np.asarray(tb) / np.maximum(np.asarray(ta), 1e-15)
    q25, q50, q75 = (float(v) for v in np.percentile(ratios, [25, 50, 75]))
    speedup = ra.median_s / rb.median_s if rb.median_s > 0 else math.inf
    return CompareResult(a=ra, b=rb, speedup=speedup, ratio_median=q50, ratio_q25=q25, ratio_q75=q75)
