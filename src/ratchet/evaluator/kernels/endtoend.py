"""The end-to-end check: the model with the kernel swapped in, against the model without it.

A kernel fast alone can make the model slower (it breaks CUDA-graph capture, it is only
fast at small contexts, its fast path is not the one the model's activations take) or
wrong (a path the standalone check never exercised changes the logits). So the last word
on a kernel is the model itself, run as the workload says:

- two children started the same way (`ratchet.evaluator.isolate.CandidateProcess`, sandboxed), each
  holding the model (`e2e_runner/model_runner.py`): the baseline with the model's own
  operators, the candidate with the kernel swapped in through the per-shape dispatch
  table (`dispatch.build_dispatch_table`): where the kernel lost, or for a shape it was
  never measured on, the call falls back to the library op. Hits and fallbacks are
  counted. The candidate's code never runs in this process;
- per workload point, the two are timed ABBA by `timing.compare` on fresh inputs (this
  process's clock, the other child frozen meanwhile), under CUDA graphs or
  torch.compile (its `compile_backend`) when the workload's mode says so, the kernel
  inside the captured or compiled model, and every timed batch's logits are checked against the
  float64 reference model run here, within `tolerances`;
- the model's time is the mix-weighted sum over the points; the gain is confirmed by the
  sequential test of `ratchet.core.stats` on the paired repetitions, at `false_keep_rate`, and
  set beside the Amdahl estimate from the kernel sweep.

`EndToEnd.outcome` says what happened, and `.reason` why a kernel is not kept: "breaks
graph capture", "wrong inside the model at ...", "slower end to end at decode ... (0.8x)",
"gain inside the noise".
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import sys
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ...core import stats
from ..isolate import CandidateError, CandidateProcess
from . import arrays
from .profile import import_torch, load_model_module
from .timing import compare
from .workload import Mode, Workload, amdahl, point_label

RUNNER = Path(__file__).with_name("e2e_runner") / "model_runner.py"
KERNEL_IMPL = "kernel"  # the kernel's name in dispatch tables the check builds
LIBRARY_IMPL = "library"

# What the end-to-end timing defaults to: a few repetitions of whole forward passes.
# The logits of a float32 model against its float64 twin: ops reorder sums, so looser than
# one kernel's output (the defaults of correctness.DEFAULT_TOLERANCES).
TOLERANCES: dict[str, tuple[float, float]] = {"float32": (1e-3, 1e-4), "float16": (3e-2, 3e-2), "bfloat16": (6e-2, 6e-2)}
TIMING: dict[str, Any] = {"warmup": 2, "min_reps": 10, "max_time_s": 3.0, "target_sem": 0.01, "verify": 1, "scale_range": (0.5, 2.0)}


class Outcome(StrEnum):
    CONFIRMED = "confirmed"  # faster end to end, confirmed by the sequential test
    UNCHANGED = "unchanged"  # every call fell back to the library op: nothing to judge
    NOISE = "noise"  # no gain the test can tell from noise
    SLOWER = "slower"  # significantly slower at some point of the workload
    WRONG = "wrong"  # logits beyond tolerance, or a failed call, inside the model
    CAPTURE_BROKEN = "capture_broken"  # the model no longer captures in a CUDA graph
    IMPLAUSIBLE = "implausible"  # faster than Amdahl's bound for the swapped ops allows
    FAILED = "failed"  # the model without the kernel failed: not the candidate's fault

    @property
    def kept(self) -> bool:
        return self is Outcome.CONFIRMED

    @property
    def rejects(self) -> bool:
        """The candidate is not kept, for a reason of its own."""
        return self in (Outcome.NOISE, Outcome.SLOWER, Outcome.WRONG, Outcome.CAPTURE_BROKEN, Outcome.IMPLAUSIBLE)


@dataclass
class Swap:
    """One operator of the model's OPS replaced by `function` of `module` (in the tree)."""

    op: str
    module: str = "kernel.py"
    function: str | None = None  # default: the op's name
    table: dict[str, Any] | None = None  # a dispatch table (impl "kernel" or the baseline); None: the kernel everywhere

    def spec(self) -> dict[str, Any]:
        return {"module": self.module, "function": self.function or self.op, "table": self.table, "impl": KERNEL_IMPL}


@dataclass
class PointResult:
    point: dict[str, Any]
    label: str
    weight: float
    baseline_s: float | None = None
    candidate_s: float | None = None
    speedup: float | None = None
    significant: bool = False
    ok: bool = True
    reasons: list[str] = field(default_factory=list)
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    baseline_samples: list[float] = field(default_factory=list)
    candidate_samples: list[float] = field(default_factory=list)


@dataclass
class EndToEnd:
    outcome: Outcome
    reason: str
    points: list[PointResult]
    mode: str
    speedup: float | None = None  # the model's, mix-weighted
    expected: float | None = None  # Amdahl's estimate from the sweep, when given
    test: dict[str, Any] | None = None
    hits: int = 0
    fallbacks: int = 0
    level: str = ""  # the children's sandbox level

    def metrics(self) -> dict[str, Any]:
        m: dict[str, Any] = {
            "e2e_outcome": self.outcome.value, "e2e_speedup": self.speedup or 0.0,
            "e2e_hits": self.hits, "e2e_fallbacks": self.fallbacks,
        }
        if self.expected is not None:
            m["e2e_expected"] = self.expected
        if self.reason:
            m["e2e_reason"] = self.reason
        return m

    def model_times(self) -> tuple[float, float] | None:
        """The model's mix-weighted time per forward (seconds) without and with the kernel."""
        if not self.points or not all(p.baseline_s and p.candidate_s for p in self.points):
            return None
        base = sum(p.weight * (p.baseline_s or 0.0) for p in self.points)
        cand = sum(p.weight * (p.candidate_s or 0.0) for p in self.points)
        return base, cand

    def mfu(self, flops_per_forward: float, peak_flops: float) -> tuple[float, float] | None:
        """Model FLOPs utilisation before and after: FLOPs per forward of the mix (from the
        profile) over its time, as a fraction of the device's measured peak."""
        times = self.model_times()
        if times is None or not flops_per_forward or not peak_flops:
            return None
        return flops_per_forward / times[0] / peak_flops, flops_per_forward / times[1] / peak_flops

    def table(self) -> str:
        lines = [f"end to end ({self.mode}, children: {self.level or 'unconfined'}): {self.outcome.value}"
                 + (f" - {self.reason}" if self.reason else "")]
        head = f"{'point':<34} {'weight':>6} {'base ms':>9} {'cand ms':>9} {'speedup':>8} {'hits':>5} {'falls':>5}"
        lines += [head, "-" * len(head)]
        for p in self.points:
            hits = sum(c["hits"] for c in p.counts.values())
            falls = sum(c["fallbacks"] for c in p.counts.values())
            lines.append(
                f"{p.label[:34]:<34} {p.weight:>6.2f} {_ms(p.baseline_s):>9} {_ms(p.candidate_s):>9} "
                f"{(f'{p.speedup:.3f}' if p.speedup else '-'):>8} {hits:>5} {falls:>5}"
                + ("" if p.ok else "  FAILED")
            )
            lines += [f"    ! {r}" for r in p.reasons]
        if self.speedup:
            est = f", Amdahl estimate {self.expected:.3f}x" if self.expected else ""
            lines.append(f"model: {self.speedup:.3f}x end to end{est}; {self.hits} kernel calls, {self.fallbacks} fallbacks (one forward per point)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return arrays.jsonable({**asdict(self), "outcome": self.outcome.value})


def _ms(t: float | None) -> str:
    return f"{t * 1e3:.3f}" if t and math.isfinite(t) else "-"


def end_to_end(
    workload: Workload,
    swaps: list[Swap],
    *,
    tree: str | Path | None = None,
    tolerances: Mapping[str, tuple[float, float]] | None = None,
    timing: Mapping[str, Any] | None = None,
    false_keep_rate: float = 0.01,
    min_gain: float = 0.0,
    expected: float | None = None,
    bound: float | None = None,
    confine: str | None = None,
    timeout: float = 300.0,
    log: Any = None,
) -> EndToEnd:
    """Run the model with and without `swaps` at every workload point; see the module doc.

    `tree`: the directory holding the model and kernel modules (default: the model's).
    `tolerances`: per dtype (rtol, atol) for the logits against the float64 reference.
    `min_gain`: the relative gain the test must confirm beyond (0.02 = 2%).
    `expected`: Amdahl's estimate from the sweep; `bound`: Amdahl's bound if the swapped
    ops took no time at all (1 / (1 - their share)): a confirmed gain well beyond it is
    not kept (`implausible`): the kernel then changed more than its own op, or the
    measurement is not sound.
    """
    torch = import_torch()
    tree = Path(tree or workload.model_path.parent).resolve()
    model_file = str(workload.model_path.relative_to(tree)) if workload.model_path.is_relative_to(tree) else str(workload.model_path)
    module = load_model_module(workload.model_path, name="ratchet_reference_model")
    device = workload.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise CandidateError(f"the workload runs on {device}, and torch sees no CUDA device here")
    reference_model = module.build_model("float64", device)

    def reference(*inputs: Any) -> Any:
        with torch.no_grad():
            return reference_model(*(x.to(device=device, dtype=torch.float64) if x.is_floating_point() else x.to(device) for x in inputs))

    def make_inputs(point: Mapping[str, Any], dtype: str, rng: Any) -> tuple[Any, ...]:
        values = module.make_inputs(dict(point), dtype, rng)
        values = values if isinstance(values, tuple | list) else (values,)
        return tuple(v.to(device) for v in values)

    opts = {**TIMING, **dict(timing or {})}
    if workload.mode is Mode.CUDA_GRAPHS:
        opts["cuda_graph"] = True
    base_spec: dict[str, Any] = {"tree": str(tree), "model": model_file, "dtype": workload.dtype, "device": device, "mode": workload.mode.value,
                 "compile_backend": workload.compile_backend, "threads": workload.threads, "swap": {}}
    cand_spec = {**base_spec, "swap": {s.op: s.spec() for s in swaps}}
    results: list[PointResult] = []
    env = {**os.environ, "OMP_NUM_THREADS": str(workload.threads)} if workload.threads else None
    with contextlib.ExitStack() as stack:
        base = stack.enter_context(CandidateProcess(RUNNER, cwd=tree, timeout=timeout, confine=confine, env=env))
        cand = stack.enter_context(CandidateProcess(RUNNER, cwd=tree, timeout=timeout, confine=confine, env=env))
        try:
            base_model = base.construct("Model", base_spec)
        except CandidateError as exc:
            return EndToEnd(Outcome.FAILED, f"the model itself does not build: {_first_line(exc)}", [], workload.mode.value)
        try:
            cand_model = cand.construct("Model", cand_spec)
        except CandidateError as exc:
            return EndToEnd(Outcome.WRONG, f"the model with the kernel does not build: {_first_line(exc)}", [], workload.mode.value,
                            level=str(cand.level or ""))
        for point, weight in zip(workload.points, workload.weights(), strict=True):
            label = point_label(point)
            result = PointResult(point=dict(point), label=label, weight=weight)
            results.append(result)
            try:
                # both run one eager forward here, so the two processes stay alike (their
                # allocators, caches and pools see the same history before the timing)
                base.call(f"{base_model.target}.census", dict(point))
                result.counts = cand.call(f"{cand_model.target}.census", dict(point))
            except CandidateError as exc:
                result.ok = False
                result.reasons.append(f"the model with the kernel fails at {label}: {_first_line(exc)}")
                continue
            cmp = compare(base_model, cand_model, make_inputs, point, workload.dtype, reference=reference, expected_dtype=workload.dtype,
                          tolerances={**TOLERANCES, **dict(tolerances or {})}, names=("library", "kernel"), **opts)
            result.baseline_s, result.candidate_s = cmp.a.median_s, cmp.b.median_s
            result.baseline_samples, result.candidate_samples = list(cmp.a.times_s), list(cmp.b.times_s)
            if not cmp.ok:
                result.ok = False
                # a side aborted by the other's failure only says it has no timed batch
                cand_why = [r for r in cmp.b.reasons if "no timed batch completed" not in r]
                base_why = [r for r in cmp.a.reasons if "no timed batch completed" not in r]
                if cand_why or not base_why:
                    result.reasons += cand_why or cmp.b.reasons
                else:
                    result.reasons += [f"baseline model: {r}" for r in base_why]
                continue
            result.speedup, result.significant = cmp.speedup, cmp.significant
            if log:
                log(f"{label}: {cmp.summary()}")
        level = str(cand.level or "")
    return _verdict(results, workload.mode.value, expected, false_keep_rate, min_gain, level, bound)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _verdict(results: list[PointResult], mode: str, expected: float | None, false_keep_rate: float, min_gain: float, level: str,
             bound: float | None = None) -> EndToEnd:
    hits = sum(sum(c["hits"] for c in p.counts.values()) for p in results)
    falls = sum(sum(c["fallbacks"] for c in p.counts.values()) for p in results)
    out = EndToEnd(Outcome.NOISE, "", results, mode, expected=expected, hits=hits, fallbacks=falls, level=level)
    failed = [p for p in results if not p.ok]
    if failed:
        first = failed[0]
        text = first.reasons[0] if first.reasons else "failed"
        if any(r.startswith("baseline model:") for r in first.reasons):
            out.outcome, out.reason = Outcome.FAILED, f"at {first.label}: {text}"
        elif "graph capture" in text.lower():
            out.outcome, out.reason = Outcome.CAPTURE_BROKEN, f"breaks graph capture at {first.label}: {text}"
        else:
            out.outcome, out.reason = Outcome.WRONG, f"wrong inside the model at {first.label}: {text}"
        return out
    base = sum(p.weight * (p.baseline_s or 0.0) for p in results)
    cand = sum(p.weight * (p.candidate_s or 0.0) for p in results)
    out.speedup = base / cand if cand else None
    if hits == 0:
        out.outcome, out.reason = Outcome.UNCHANGED, "every call fell back to the library op: the model is unchanged"
        return out
    diffs = _paired_gains(results, 0.0)
    if len(diffs) < 2:
        out.reason = "too few repetitions to confirm a gain"
        return out
    # slower: the whole mix, or one point, slower by a one-sided paired t-test at 1%
    # (split over the points for the per-point tests): the middle half of a point's
    # ratios on the slow side is no evidence on a loaded machine (seen: an honest fused
    # GELU "0.725x" at one point with ratios [1.07, 1.95], the mix 0.91x, at load 6)
    critical = stats.t_ppf(0.99, len(diffs) - 1)
    slow_points = []
    for p in results:
        t_point = _t([math.log(a / b) for a, b in zip(p.baseline_samples, p.candidate_samples, strict=False) if a > 0 and b > 0])
        n_point = min(len(p.baseline_samples), len(p.candidate_samples))
        if n_point >= 2 and t_point < -stats.t_ppf(1 - 0.01 / len(results), n_point - 1):
            slow_points.append(p)
    if slow_points or _t(diffs) < -critical:
        worst = min(slow_points or [p for p in results if p.speedup], key=lambda p: p.speedup or 1.0)
        out.outcome, out.reason = Outcome.SLOWER, f"slower end to end at {worst.label} ({worst.speedup:.3f}x; the mix {out.speedup:.3f}x)"
        return out
    diffs = _paired_gains(results, min_gain)
    spread = statistics.stdev(diffs)
    noise = stats.Noise(spread, float(len(diffs) - 1), "paired end-to-end repetitions", relative=True)
    # one look, after the repetitions the timing rule chose (it stops on precision, never
    # on the sign of the gain): the whole false-keep rate is spent on it
    test = stats.sequential(diffs, noise, stats.Design(false_keep_rate, 1, prior=0.0),
                            per_pair=True)
    out.test = {"step": test.step.value, "pairs": test.pairs, "mean": test.mean, "t": test.t, "critical": test.critical, "reason": test.reason}
    est = f" (Amdahl estimate {expected:.3f}x)" if expected else ""
    if test.step is stats.Step.KEEP and bound and out.speedup and out.speedup > bound * 1.1:
        # more than the swapped ops' whole share could give, had they taken no time: the
        # kernel changed more than its op (a global setting), or the two model processes
        # did not run alike (seen on a loaded machine: one point 2.8x with an op of 1%)
        out.outcome = Outcome.IMPLAUSIBLE
        out.reason = (f"{out.speedup:.3f}x end to end is beyond Amdahl's bound {bound:.3f}x for the swapped ops' "
                      f"share{est}: the kernel changed more than its op, or the measurement is not sound")
    elif test.step is stats.Step.KEEP:
        out.outcome, out.reason = Outcome.CONFIRMED, f"{out.speedup:.3f}x end to end{est}: {test.reason}"
    else:
        out.outcome, out.reason = Outcome.NOISE, f"gain inside the noise: {out.speedup:.3f}x end to end{est}; {test.reason}"
    return out


def _t(values: list[float]) -> float:
    """The one-sample t statistic of `values` against 0 (0 for fewer than two)."""
    if len(values) < 2:
        return 0.0
    mean, spread = statistics.fmean(values), statistics.stdev(values)
    if spread == 0:
        return math.copysign(math.inf, mean) if mean else 0.0
    return mean / (spread / math.sqrt(len(values)))


def _paired_gains(results: list[PointResult], min_gain: float) -> list[float]:
    """Per repetition j, log(model time without / with the kernel) less log(1 + min_gain).

    The points were timed one after another, each ABBA; repetition j of every point makes
    one paired measurement of the whole mix.
    """
    n = min((min(len(p.baseline_samples), len(p.candidate_samples)) for p in results), default=0)
    gains = []
    for j in range(n):
        base = sum(p.weight * p.baseline_samples[j] for p in results)
        cand = sum(p.weight * p.candidate_samples[j] for p in results)
        if base > 0 and cand > 0:
            gains.append(math.log(base / cand) - math.log1p(min_gain))
    return gains


def expected_speedup(op_share: float, weighted_speedup: float) -> float:
    """Amdahl's estimate for the model from the op's share and its weighted sweep speed-up."""
    return amdahl(op_share, weighted_speedup)


def log_stderr(text: str) -> None:
    print(text, file=sys.stderr)
