"""Honest timing: `bench()` for one implementation, `compare()` for two, interleaved.

The clock is this (trusted) process's, around a request that runs N calls back to back in
the candidate process (or here, for the trusted baseline). The rules, each from a way
published kernel timings went wrong or were gamed:

- **check what you time**: every timed batch's outputs are read back the moment it
  answers; every call's output must be fully written (outputs are poisoned before each
  batch) and must not change afterwards; a random sample of the calls (`verify` per
  batch, chosen here with OS randomness after the batch ran, so the candidate cannot
  predict it) is compared with the float64 reference, inputs included;
- **fresh inputs**: before every batch every input is refilled with fresh random data
  from `make_inputs`, outside the timed region, so no result cache can hit;
- **no memo within a batch**: the N calls of a batch use N distinct input/output buffer
  sets, so remembering the last call gains nothing;
- **indistinguishable**: checks, warm-ups and timed batches are the same request;
  nothing tells the candidate which calls are timed or verified;
- **amortised**: N is chosen so a request lasts well beyond the request round trip; the
  median round trip of an empty request (measured after every batch, on a clean child
  started like the candidate's but holding no candidate code: nothing the candidate
  answers corrects its own time) is subtracted and reported as host overhead; on CUDA the child synchronizes the device before answering,
  or (`cuda_graph=True`) captures the N calls in one CUDA graph whose replay is timed;
- warm-up batches first (JIT, autotune); repeat until the standard error of the mean is
  under `target_sem` or `max_time_s`; report the median, the IQR and the SEM; a result
  that missed the SEM target says so (`converged`), it is never passed off as exact;
- A/B comparisons alternate ABBA on the same fresh inputs, so drift hits both sides;
- **a frozen candidate**: the whole candidate is stopped while its inputs are filled and
  wakes inside the clock, so nothing is computed before the clock starts;
- **a quiet evaluator**: while one side runs, the other side's candidate process is
  stopped, and before every timed request the harness waits until its own thread pools
  (OpenMP, BLAS) have stopped busy-waiting (`quiesce.settle`), so neither side shares
  the cores with leftover spinning from the other; the trusted baseline then gets one
  untimed warm-up call, so its own pool is awake as between back-to-back calls.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from . import arrays, guard, quiesce
from .correctness import (
    MakeInputs,
    OutFactory,
    Shape,
    _Fail,
    changed_after_answer,
    fresh_inputs,
    inputs_unchanged,
    output_specs,
    reference_outputs,
    snapshot,
    unwritten_or_bad,
    verify_outputs,
)
from .runner import CallFailed, Runner, Slot, as_runner, fill, new_slot, sync_all


@dataclass
class BenchResult:
    """Per-call times of one implementation and the statistics a judge needs."""

    name: str
    times_s: list[float]
    median_s: float
    iqr_s: float
    mean_s: float
    sem_rel: float
    reps: int
    calls: int
    warmup: int
    converged: bool
    device: str
    timer: str
    request_overhead_s: float = 0.0
    verified: int = 0
    reasons: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.reasons

    @property
    def time_ms(self) -> float:
        return self.median_s * 1e3

    @property
    def sem_s(self) -> float:
        """Standard error of the per-call time, in seconds."""
        return self.sem_rel * self.mean_s if math.isfinite(self.sem_rel) else math.inf

    @property
    def host_overhead_per_call_s(self) -> float:
        """The request round trip each call carried (subtracted from `median_s`)."""
        return self.request_overhead_s / max(1, self.calls)

    def summary(self) -> str:
        status = "ok" if self.ok else "FAILED: " + "; ".join(self.reasons)
        precision = f"sem {self.sem_rel * 100:.2f}%" + ("" if self.converged else " (IMPRECISE: SEM target missed)")
        return (
            f"{self.name}: median {self.median_s * 1e3:.4f} ms/call, IQR {self.iqr_s * 1e3:.4f} ms, {precision}, "
            f"{self.reps} batches x {self.calls} calls ({self.timer}; request overhead "
            f"{self.request_overhead_s * 1e6:.1f} us = {self.host_overhead_per_call_s * 1e6:.2f} us/call, "
            f"{self.verified} timed calls verified) {status}"
        )

    def to_dict(self, with_samples: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_samples:
            d.pop("times_s")
        d["ok"] = self.ok
        d["host_overhead_per_call_s"] = self.host_overhead_per_call_s
        return arrays.jsonable(d)


@dataclass
class CompareResult:
    """A vs B measured in alternating order (ABBA...), so drift hits both equally."""

    a: BenchResult
    b: BenchResult
    speedup: float  # time_a / time_b: > 1 means b is faster
    ratio_median: float
    ratio_q25: float
    ratio_q75: float
    speedup_sem_rel: float = math.inf

    @property
    def ok(self) -> bool:
        return self.a.ok and self.b.ok

    @property
    def significant(self) -> bool:
        """The middle half of paired ratios excludes 1: the difference is not noise."""
        return self.ratio_q75 < 1.0 or self.ratio_q25 > 1.0

    def summary(self) -> str:
        return (
            f"{self.a.name} {self.a.median_s * 1e3:.4f} ms vs {self.b.name} {self.b.median_s * 1e3:.4f} ms: "
            f"speedup {self.speedup:.3f} (+-{self.speedup_sem_rel * 100:.1f}%), paired ratio IQR "
            f"[{self.ratio_q25:.3f}, {self.ratio_q75:.3f}]{'' if self.significant else ' (not significant)'}"
        )

    def to_dict(self) -> dict[str, Any]:
        return arrays.jsonable({
            "a": self.a.to_dict(),
            "b": self.b.to_dict(),
            "speedup": self.speedup,
            "speedup_sem_rel": self.speedup_sem_rel,
            "ratio_median": self.ratio_median,
            "ratio_q25": self.ratio_q25,
            "ratio_q75": self.ratio_q75,
            "significant": self.significant,
            "ok": self.ok,
        })


def capture_timers() -> list[str]:
    """Capture torch's timers too (kept for evaluators that time trusted code in-process)."""
    return guard.capture_timers()


def verify_timers() -> list[str]:
    """Reasons the timers or comparison functions of this process were replaced (empty if not)."""
    return guard.verify_timers()


CPU_SLACK = 1.1  # scheduler accounting jitter on the candidate's CPU time per request
CPU_SLACK_S = 1e-3


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


@dataclass
class _Verifier:
    """What the harness needs to check a timed call's outputs."""

    reference: Callable[..., Any]
    rtol: float | None
    atol: float | None
    tolerances: Mapping[str, tuple[float, float]] | None
    per_batch: int  # calls verified against the reference per batch; <= 0: all
    allow_inplace: bool
    rng: np.random.Generator = field(default_factory=lambda: np.random.default_rng(int.from_bytes(os.urandom(8), "little")))


class _Side:
    """One implementation being timed: its runner, its N slots, its samples."""

    def __init__(self, runner: Runner, mode: str, verifier: _Verifier | None) -> None:
        self.runner = runner
        self.mode = mode
        self.verifier = verifier
        self.slots: list[Slot] = []
        self.graph: Any = None
        self.samples: list[float] = []
        self.overheads: list[float] = []
        self.stats = _Welford()
        self.verified = 0
        self.settled_s = 0.0  # waited for this process's other threads to go idle
        self.reasons: list[str] = []

    @property
    def label(self) -> str:
        return self.runner.label

    def allocate(self, fresh_sets: Sequence[tuple[Any, ...]], specs: list[tuple[tuple[int, ...], str]]) -> None:
        self.slots = [new_slot(self.runner, fresh_sets[0], specs) for _ in fresh_sets]

    def request(self, fresh_sets: Sequence[tuple[Any, ...]]) -> float:
        """Fill, poison, one timed request (N calls or one replay); raw seconds."""
        # Our own thread pools may still be spinning (a BLAS call in the check or a
        # reference, the last batch's OpenMP workers) and would take a core from the
        # request (quiesce.py). Before a candidate's request none may run, the fill's
        # included: settle after the fill. Before our own trusted baseline, settle before
        # it, then one untimed warm-up call: the pool the baseline uses is awake, as
        # between back-to-back calls. (Left asleep, a 2-thread torch pool added ~0.2 ms
        # to every batch: a slower baseline, a candidate that looks faster.)
        if self.runner.remote:
            # The whole candidate is frozen while its inputs are filled, and wakes only
            # inside the clock (CandidateProcess.request): a thread watching its buffers
            # cannot compute the answer before the clock starts.
            with self.runner.frozen():
                # new buffers are registered first: the child runs for that exchange, and
                # must not see this batch's inputs while it does
                self.runner.flush()
                for slot, values in zip(self.slots, fresh_sets, strict=True):
                    fill(slot, values)
                sync_all(self.slots)
                self.settled_s += quiesce.settle()
                if self.graph is not None:
                    t = self.runner.replay(self.graph)
                else:
                    t = self.runner.run(self.slots, self.mode)
                self._check_cpu()
                return t
        else:
            self.settled_s += quiesce.settle()
            self._settle_gpu()
            for slot, values in zip(self.slots, fresh_sets, strict=True):
                fill(slot, values)
            if self.verifier is None and self.graph is None:  # never for code we check: a warm-up could feed a cache
                self.runner.warm(self.slots[0], self.mode)
            sync_all(self.slots)
        if self.graph is not None:
            return self.runner.replay(self.graph)
        return self.runner.run(self.slots, self.mode)

    def _settle_gpu(self) -> None:
        """Before a trusted side's batch on a GPU: nothing of the (frozen) candidate may still
        run there. GPU work it queued in another context, or on a stream it never waited for,
        runs on after the freeze and would slow the baseline; wait for it to drain, and fail
        the candidate if it does not (its helpers queued more than a second of work)."""
        outs = self.slots[0].output_views() if self.slots else ()
        cuda = [x for x in outs if arrays.is_torch(x) and x.is_cuda]
        if not cuda:
            return
        waited, busy = quiesce.settle_gpu(arrays.torch_module(), cuda[0].device)
        self.settled_s += waited
        if busy:
            raise _Fail(
                f"candidate: the GPU stayed busy for {waited:.2f} s while the candidate was frozen and "
                f"before {self.label} was timed: work queued in another CUDA context or on a stream "
                "the candidate never waited for"
            )

    def _check_cpu(self) -> None:
        """The candidate may use the CPUs this evaluation was given, not more.

        The baseline runs here on this process's CPUs; a child that widened its affinity
        (or a helper that did) would time its kernel on cores the baseline never had.
        """
        usage = getattr(getattr(self.runner, "process", None), "last_request", None)
        if usage is None or not hasattr(os, "sched_getaffinity"):
            return
        allowed = len(os.sched_getaffinity(0))
        if usage.cpu_s > allowed * usage.awake_s * CPU_SLACK + CPU_SLACK_S:
            raise _Fail(
                f"{self.label}: used {usage.cores():.2f} CPUs' worth of time during a timed request, "
                f"but this evaluation has {allowed} CPU(s): it ran on CPUs the baseline was not given "
                "(a widened affinity or a helper outside them)"
            )

    def overhead(self) -> float:
        """The round trip of an empty request (a clean child's, for a candidate), median so far.

        Measured with the candidate frozen, as its own requests start frozen, so the
        wake-up inside the clock is in both.
        """
        self.settled_s += quiesce.settle()
        with self.runner.frozen():
            self.overheads.append(self.runner.empty_request())
        return float(np.median(self.overheads))

    def check(self, fresh_sets: Sequence[tuple[Any, ...]], reference_of: Callable[[int], list[Any]]) -> None:
        """Read back every call's outputs; verify a random sample against the reference."""
        verifier = self.verifier
        if verifier is None:
            return
        with self.runner.frozen():  # a thread left running cannot finish the work while we read
            taken = [snapshot(slot) for slot in self.slots]
        who = self.label
        for k, outs in enumerate(taken):
            unwritten_or_bad(outs, f"{who} (call {k} of a batch)")
        n = len(self.slots)
        count = n if verifier.per_batch <= 0 else min(n, verifier.per_batch)
        for k in sorted(verifier.rng.choice(n, size=count, replace=False).tolist()):
            problems = verify_outputs(taken[k], reference_of(k), verifier.rtol, verifier.atol, verifier.tolerances)
            if problems:
                raise _Fail(f"{who}: a timed call's output is wrong: " + "; ".join(problems))
            if not verifier.allow_inplace:
                inputs_unchanged(self.slots[k], fresh_sets[k], f"{who} (timed call)")
            self.verified += 1
        for slot, outs in zip(self.slots, taken, strict=True):
            changed_after_answer(slot, outs, f"{who} (timed call)")

    def result(self, warmup: int, target_sem: float, cuda: bool) -> BenchResult:
        samples = self.samples or [math.inf]
        a = np.asarray(samples, dtype=np.float64)
        with np.errstate(invalid="ignore"):  # no sample: inf everywhere, no warning
            q25, q50, q75 = (float(v) for v in np.percentile(a, [25, 50, 75]))
        sem = self.stats.sem_rel()
        timer = "host clock around a CUDA-graph replay" if self.graph is not None else "host clock around one request"
        if cuda and self.graph is None:
            timer += " + device sync"
        reasons = list(self.reasons)
        if not self.samples and not reasons:
            reasons.append(f"{self.label}: no timed batch completed")
        reasons += [f"{self.label}: {p}" for p in guard.verify_timers()]
        return BenchResult(
            name=self.label,
            times_s=list(self.samples),
            median_s=q50,
            iqr_s=q75 - q25,
            mean_s=float(a.mean()),
            sem_rel=sem,
            reps=len(self.samples),
            calls=len(self.slots),
            warmup=warmup,
            converged=sem < target_sem,
            device="cuda" if cuda else "cpu",
            timer=timer,
            request_overhead_s=float(np.median(self.overheads)) if self.overheads else 0.0,
            verified=self.verified,
            reasons=reasons,
        )


def _set_bytes(inputs: tuple[Any, ...], specs: list[tuple[tuple[int, ...], str]]) -> int:
    from .roofline import ITEMSIZE  # noqa: PLC0415 - roofline imports hardware; keep this light

    out = sum(math.prod(shape) * ITEMSIZE.get(dtype, 4) for shape, dtype in specs)
    return sum(arrays.nbytes(x) for x in inputs if arrays.is_array(x)) + out


def _run(
    impls: Sequence[tuple[Any, str | None, bool]],
    make_inputs: MakeInputs,
    shape: Shape,
    dtype: str,
    *,
    reference: Callable[..., Any] | None,
    out: OutFactory | None,
    expected_dtype: str | Callable[[str, int], str] | None,
    rtol: float | None,
    atol: float | None,
    tolerances: Mapping[str, tuple[float, float]] | None,
    verify: int,
    allow_inplace: bool,
    calls: int | None,
    max_calls: int | None,
    min_request_s: float | None,
    memory_bytes: int | None,
    warmup: int,
    min_reps: int,
    max_reps: int,
    max_time_s: float,
    target_sem: float,
    cuda_graph: bool,
    perturb: bool,
    scale_range: tuple[float, float],
    seed: int,
) -> tuple[list[BenchResult], list[float]]:
    """The shared loop of bench/compare: (results per implementation, paired ratios b/a)."""
    perf = guard._CLOCK
    rng = np.random.default_rng([seed, 0x71])

    def fresh() -> tuple[Any, ...]:
        return fresh_inputs(make_inputs, shape, dtype, rng, perturb, scale_range)

    first = fresh()
    ref_first = reference(*(arrays.upcast(x) for x in first)) if reference is not None else None
    if out is None and ref_first is None:
        raise ValueError("timing needs reference= (to size and check the outputs) or out= (an output factory)")
    specs = output_specs(arrays.as_tuple(ref_first) if ref_first is not None else (), first, shape, dtype, expected_dtype, out)
    mode = "out" if out is not None else "return"
    sides = []
    for impl, label, trusted in impls:
        runner = as_runner(impl, label)
        verifier = None
        if reference is not None and not trusted:
            verifier = _Verifier(reference, rtol, atol, tolerances, verify, allow_inplace)
        # A trusted baseline is called as baseline(*inputs); its result is copied into an
        # output buffer exactly when the candidate's is (return mode), so both pay alike.
        sides.append(_Side(runner, mode if not trusted or mode == "return" else "plain", verifier))
    # Every candidate process stays frozen for the whole measurement: it runs only inside
    # its own requests (which wake it inside the clock), never while inputs are filled,
    # outputs read back or the baseline timed; one stop and one wake per request.
    with contextlib.ExitStack() as held:
        for side in sides:
            if side.runner.remote:
                held.enter_context(side.runner.frozen())
        return _measure(
            sides, first, fresh, specs, reference, calls=calls, max_calls=max_calls, min_request_s=min_request_s,
            memory_bytes=memory_bytes, warmup=warmup, min_reps=min_reps, max_reps=max_reps, max_time_s=max_time_s,
            target_sem=target_sem, cuda_graph=cuda_graph, perf=perf,
        )


def _measure(
    sides: list[_Side], first: tuple[Any, ...], fresh: Callable[[], tuple[Any, ...]], specs: list[tuple[tuple[int, ...], str]],
    reference: Callable[..., Any] | None, *, calls: int | None, max_calls: int | None, min_request_s: float | None,
    memory_bytes: int | None, warmup: int, min_reps: int, max_reps: int, max_time_s: float, target_sem: float,
    cuda_graph: bool, perf: Callable[[], float],
) -> tuple[list[BenchResult], list[float]]:
    """The probe, the warm-ups and the timed loop of `_run`, the candidates already frozen."""
    cuda = any(arrays.is_torch(x) and x.is_cuda for x in first)
    set_bytes = max(1, _set_bytes(first, specs))

    # How many calls per request: enough to dwarf the request round trip.
    probe = [first]
    estimates = []
    try:
        for side in sides:
            side.allocate(probe, specs)
            side.request(probe)  # also a warm-up
            t = side.request(probe)
            rtt = side.overhead()
            estimates.append(max(t - rtt, 0.5 * t, 1e-7))
    except CallFailed as exc:
        return _abort(sides, f"{exc}", warmup, target_sem, cuda), []
    except _Fail as fail:
        return _abort(sides, f"{fail}", warmup, target_sem, cuda), []
    if calls is None:
        # Enough calls that the round trip is a small part of the request. CPU: within
        # reason (under heavy load a round trip can take milliseconds, and the kernel's
        # own time is what matters). GPU: a replay or a batch of a few ms, so the round
        # trip's jitter is a percent or less of it.
        rtt = max(s.overhead() for s in sides)
        if cuda:
            target = max(min_request_s or 5e-3, 20 * rtt)
        else:
            target = max(min_request_s or 1e-3, min(5 * rtt, 5e-3))
        calls = math.ceil(target / min(estimates))
    cap = max_calls or (256 if cuda else 64)
    mem_cap = memory_bytes or ((8 << 30) if cuda else (256 << 20))
    calls = int(max(1, min(calls, cap, mem_cap // set_bytes)))
    for side in sides:
        side.runner.release(side.slots)
    batch = [fresh() for _ in range(calls)]
    ref_cache: dict[int, list[Any]] = {}

    def reference_of(k: int) -> list[Any]:
        if k not in ref_cache:
            ref_cache[k] = reference_outputs(reference, batch[k])[1]  # type: ignore[arg-type]
        return ref_cache[k]

    try:
        for side in sides:
            side.allocate(batch, specs)
            if cuda_graph:
                for slot, values in zip(side.slots, batch, strict=True):
                    fill(slot, values)
                sync_all(side.slots)
                side.graph = side.runner.capture(side.slots, side.mode)
        for _ in range(max(0, warmup - 1)):  # the probe's first request was the first warm-up
            for side in sides:
                with _others_frozen(side, sides):
                    side.request(batch)
                side.check(batch, reference_of)
        ratios: list[float] = []
        ratio_stats = _Welford()
        started = perf()
        rep = 0
        while rep < max_reps:
            batch[:] = [fresh() for _ in range(calls)]
            ref_cache.clear()
            order = sides if rep % 2 == 0 else sides[::-1]
            for side in order:
                with _others_frozen(side, sides):
                    t = side.request(batch)
                # the empty-request round trip: after the first batches, then every 4th
                rtt = side.overhead() if rep < 3 or rep % 4 == 0 else float(np.median(side.overheads))
                per_call = max(t - rtt, 0.5 * t) / calls
                side.check(batch, reference_of)
                side.samples.append(per_call)
                side.stats.add(per_call)
            if len(sides) == 2:
                ratios.append(sides[1].samples[-1] / sides[0].samples[-1])
                ratio_stats.add(ratios[-1])
            rep += 1
            tight = all(s.stats.sem_rel() < target_sem for s in sides) or (len(sides) == 2 and ratio_stats.sem_rel() < target_sem / 2)
            if rep >= min_reps and (tight or perf() - started > max_time_s):
                break
    except CallFailed as exc:
        return _abort(sides, f"{exc}", warmup, target_sem, cuda), []
    except _Fail as fail:
        return _abort(sides, f"{fail}", warmup, target_sem, cuda), []
    finally:
        for side in sides:
            side.runner.release(side.slots)
    return [s.result(warmup, target_sem, cuda) for s in sides], ratios


def _others_frozen(side: _Side, sides: list[_Side]) -> contextlib.ExitStack:
    """Every other side's candidate process is stopped while this side runs.

    An idle candidate must not slow down what it is compared with: OpenMP threads that
    keep spinning after its own call, or a deliberate busy loop, would otherwise make the
    baseline look slow (seen: torch.softmax timed 6x slower beside an idle torch child).
    """
    stack = contextlib.ExitStack()
    for other in sides:
        if other is not side:
            stack.enter_context(other.runner.frozen())
            other.runner.settle()  # and nothing of it (its clean twin's warden) still at work
    return stack


def _abort(sides: list[_Side], reason: str, warmup: int, target_sem: float, cuda: bool) -> list[BenchResult]:
    for side in sides:
        if reason.startswith(side.label) or side.verifier is not None:
            side.reasons.append(reason)
            break
    else:
        sides[-1].reasons.append(reason)
    return [s.result(warmup, target_sem, cuda) for s in sides]


_DEFAULTS: dict[str, Any] = {
    "reference": None,
    "out": None,
    "expected_dtype": None,
    "rtol": None,
    "atol": None,
    "tolerances": None,
    "verify": 1,
    "allow_inplace": False,
    "calls": None,
    "max_calls": None,
    "min_request_s": None,  # 1 ms on CPU, 5 ms on CUDA
    "memory_bytes": None,
    "warmup": 1,
    "min_reps": 5,
    "max_reps": 10_000,
    "max_time_s": 2.0,
    "target_sem": 0.01,
    "cuda_graph": False,
    "perturb": True,
    "scale_range": (1e-2, 16.0),
    "seed": 0,
}


def bench(
    fn: Any,
    make_inputs: MakeInputs,
    shape: Shape,
    dtype: str = "float32",
    *,
    name: str | None = None,
    trusted: bool | None = None,
    **options: Any,
) -> BenchResult:
    """Time `fn` on `shape`/`dtype` with inputs from make_inputs(shape, dtype, rng).

    `fn`: a RemoteFunction (candidate process) or a trusted callable. With `reference=`
    (float64 reference function) every batch is checked as described in the module doc;
    `out=factory(shape, dtype, inputs)` calls fn(*inputs, out=buffers) instead of copying
    its result. Options: see `_DEFAULTS` and docs/kernels.md.
    """
    opts = _options(options)
    is_trusted = not hasattr(fn, "process") if trusted is None else trusted
    results, _ = _run([(fn, name, is_trusted)], make_inputs, shape, dtype, **opts)
    return results[0]


def compare(
    a: Any,
    b: Any,
    make_inputs: MakeInputs,
    shape: Shape,
    dtype: str = "float32",
    *,
    names: tuple[str, str] | None = None,
    **options: Any,
) -> CompareResult:
    """Time a (usually the trusted baseline) and b (the candidate) ABBA on the same inputs.

    Only b's outputs are verified: a is the trusted side. speedup = time_a / time_b.
    """
    opts = _options(options)
    label_a, label_b = names or (None, None)
    (ra, rb), ratios = _run([(a, label_a, True), (b, label_b, False)], make_inputs, shape, dtype, **opts)
    if ratios:
        r = np.asarray(ratios)
        q25, q50, q75 = (float(v) for v in np.percentile(r, [25, 50, 75]))
    else:
        q25 = q50 = q75 = math.nan
    speedup = ra.median_s / rb.median_s if rb.median_s > 0 and math.isfinite(rb.median_s) else 0.0
    sem = math.sqrt(ra.sem_rel**2 + rb.sem_rel**2)
    if len(ratios) >= 2:
        stats = _Welford()
        for x in ratios:
            stats.add(x)
        sem = min(sem, stats.sem_rel())
    return CompareResult(a=ra, b=rb, speedup=speedup, ratio_median=q50, ratio_q25=q25, ratio_q75=q75, speedup_sem_rel=sem)


def _options(options: Mapping[str, Any]) -> dict[str, Any]:
    unknown = set(options) - set(_DEFAULTS)
    if unknown:
        raise TypeError(f"unknown timing option(s): {', '.join(sorted(unknown))} (known: {', '.join(sorted(_DEFAULTS))})")
    return {**_DEFAULTS, **options}
