"""Shape sweeps: check + time + roofline for every shape, and the metric lines ratchet reads.

A kernel that wins on the benchmark shapes and loses (or is wrong) on the ones the
model really runs is the commonest failure of kernel autoresearch. So the sweep covers
the full production range the evaluator lists, plus hold-out shapes that only the
trusted hold-out run loads (`--holdout` or RATCHET_HOLDOUT=1), so a proposer never sees
them and cannot special-case them. Every shape is checked and timed separately; the
study metric is the geometric mean of per-shape speedups over the baseline (a mean of
ratios that no single shape dominates), and any failing shape makes the whole
candidate incorrect.
"""

from __future__ import annotations

import json
import math
import os
import sys
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ...core import stats
from .. import channel
from . import arrays
from .correctness import MakeInputs, Shape, check_case, shape_key
from .roofline import Peaks, assess, evaluate
from .timing import compare

HOLDOUT_ENV = "RATCHET_HOLDOUT"
SHAPE_KEY = "shape_speedup_"  # + the shape's index in the sweep: one metric per shape


def holdout_requested(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> bool:
    """True under `--holdout` on the command line, or when RATCHET_HOLDOUT is set.

    ratchet's worker sets RATCHET_HOLDOUT to the hidden hold-out data directory for the
    hold-out phase only; "1"/"true" also count, "0"/"false"/"" do not.
    """
    argv = sys.argv[1:] if argv is None else argv
    env = os.environ if env is None else env
    value = env.get(HOLDOUT_ENV, "").strip()
    return "--holdout" in argv or value.lower() not in ("", "0", "false", "no")


def load_holdout(
    source: str | os.PathLike[str] | Iterable[Shape] | Callable[[], Iterable[Shape]],
    argv: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Hold-out shapes, or [] unless the hold-out run was requested.

    `source` is a JSON file (a list of shape dicts, or {"shapes": [...]}), a list, or a
    callable. It is only read when requested, so the regular evaluation (whose output a
    proposer may see) never touches it. A file of the same name inside the directory
    RATCHET_HOLDOUT names (ratchet's hidden hold-out data, e.g. .ratchet/holdout/) wins
    over `source`: keep the shapes there and no proposer can read them.
    """
    if not holdout_requested(argv, env):
        return []
    env = os.environ if env is None else env
    if callable(source):
        return [dict(s) for s in source()]
    if isinstance(source, str | os.PathLike):
        path = Path(source)
        hidden_dir = env.get(HOLDOUT_ENV, "")
        if hidden_dir and Path(hidden_dir).is_dir() and (Path(hidden_dir) / path.name).is_file():
            path = Path(hidden_dir) / path.name
        data = json.loads(path.read_text())
        return [dict(s) for s in (data["shapes"] if isinstance(data, dict) else data)]
    return [dict(s) for s in source]


@dataclass
class ShapeResult:
    """One shape x dtype: correct?, times, speedup, where it sits on the roofline."""

    shape: dict[str, Any]
    dtype: str
    holdout: bool
    correct: bool
    reasons: list[str]
    time_s: float | None = None
    baseline_time_s: float | None = None
    speedup: float | None = None
    speedup_sem_rel: float | None = None
    time_sem_rel: float | None = None
    precise: bool | None = None
    significant: bool | None = None
    host_overhead_per_call_s: float | None = None
    calls_per_request: int | None = None
    verified_calls: int | None = None
    roofline: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    check: dict[str, Any] | None = None

    @property
    def key(self) -> str:
        return f"{shape_key(self.shape)} {self.dtype}"

    def to_dict(self) -> dict[str, Any]:
        return arrays.jsonable(asdict(self))


def geomean(values: Iterable[float]) -> float:
    vals = [v for v in values if v is not None]
    if not vals or any(v <= 0 or math.isnan(v) for v in vals):
        return 0.0
    return float(math.exp(sum(math.log(v) for v in vals) / len(vals)))


def _geomean_sem_rel(rels: Sequence[float | None]) -> float:
    """Relative SEM of a geometric mean of n independent values: sqrt(sum rel_i^2) / n."""
    vals = [r for r in rels if r is not None]
    if not vals:
        return math.inf
    return math.sqrt(sum(r * r for r in vals)) / len(vals)


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class SweepReport:
    results: list[ShapeResult] = field(default_factory=list)
    candidate: str = "candidate"
    baseline: str = "baseline"
    # stopped after this many shapes: clearly slower than the incumbent on them
    stopped_after: int | None = None

    @property
    def correct(self) -> bool:
        return bool(self.results) and all(r.correct for r in self.results)

    @property
    def failures(self) -> list[ShapeResult]:
        return [r for r in self.results if not r.correct]

    @property
    def reason(self) -> str:
        """The first failure's first reason, on one line ('' when everything passed)."""
        for r in self.failures:
            first = r.reasons[0] if r.reasons else "failed"
            return _one_line(f"{r.key}{' (hold-out)' if r.holdout else ''}: {first}")
        return ""

    def geomean_speedup(self, holdout: bool | None = None) -> float:
        """Geometric mean over the (public / hold-out / all) shapes; 0 if any failed."""
        chosen = [r for r in self.results if holdout is None or r.holdout == holdout]
        if not chosen or not all(r.correct for r in chosen):
            return 0.0
        return geomean(r.speedup for r in chosen if r.speedup is not None)

    def metrics(self) -> dict[str, Any]:
        """The metrics an evaluator reports (`speedup` or `time_ms` is the study metric).

        `<metric>_sem` is the standard error of each headline metric, so a judge can tell
        noise from gain; `timing_precise` is false when any shape missed its SEM target.
        A failing sweep reports `reason` (the first guard that fired).
        """
        times = [r.time_s for r in self.results if r.time_s]
        correct = self.correct
        time_ms = geomean(t * 1e3 for t in times) if correct and times else math.inf
        speedup = self.geomean_speedup()
        m: dict[str, Any] = {
            "correct": correct,
            "speedup": speedup,
            "speedup_sem": speedup * _geomean_sem_rel([r.speedup_sem_rel for r in self.results]) if correct and speedup else 0.0,
            "time_ms": time_ms,
            "time_ms_sem": time_ms * _geomean_sem_rel([r.time_sem_rel for r in self.results]) if correct and times else math.inf,
            "timing_precise": bool(self.results) and all(bool(r.precise) for r in self.results),
            "shapes": len(self.results),
            "shapes_failed": len(self.failures),
        }
        if not correct:
            m["reason"] = self.reason or "no shapes were run"
        if any(r.holdout for r in self.results):
            m["public_speedup"] = self.geomean_speedup(holdout=False)
            m["holdout_speedup"] = self.geomean_speedup(holdout=True)
        speedups = [r.speedup for r in self.results if r.speedup is not None]
        if speedups:
            m["min_speedup"] = min(speedups)
            m["max_speedup"] = max(speedups)
        pcts = [r.roofline["pct_of_bound"] for r in self.results if r.roofline]
        if pcts:
            m["roofline_pct"] = geomean(pcts)
        overheads = [r.host_overhead_per_call_s for r in self.results if r.host_overhead_per_call_s is not None]
        if overheads:
            m["host_overhead_us"] = float(np.median(overheads)) * 1e6
        warnings = sum(len(r.warnings) for r in self.results)
        if warnings:
            m["warnings"] = warnings
        # per-shape speedups in sweep order: what a later candidate's sweep is compared
        # with, shape by shape, to stop it early ($RATCHET_INCUMBENT_EXTRA)
        for i, r in enumerate(self.results):
            if r.speedup is not None and not r.holdout:
                m[f"{SHAPE_KEY}{i}"] = r.speedup
        if self.stopped_after is not None:
            m["stopped_early"] = 1
            m["stopped_after_shapes"] = self.stopped_after
        return m

    def table(self) -> str:
        """A fixed-width per-shape table for logs and reports."""
        head = (
            f"{'shape':<28} {'dtype':<9} {'set':<7} {'ok':<3} {'base ms':>10} {'cand ms':>10} {'sem%':>5} "
            f"{'speedup':>8} {'%roof':>6} {'bound':<8} {'calls':>5}"
        )
        lines = [head, "-" * len(head)]
        for r in self.results:
            roof = r.roofline or {}
            pct = f"{roof['pct_of_bound']:.1f}" if roof.get("pct_of_bound") is not None else "-"
            sem = f"{r.time_sem_rel * 100:.1f}" if r.time_sem_rel is not None and math.isfinite(r.time_sem_rel) else "-"
            lines.append(
                f"{shape_key(r.shape):<28} {r.dtype:<9} {'holdout' if r.holdout else 'public':<7} "
                f"{'yes' if r.correct else 'NO':<3} "
                f"{_ms(r.baseline_time_s):>10} {_ms(r.time_s):>10} {sem:>5} "
                f"{(f'{r.speedup:.3f}' if r.speedup else '-'):>8} "
                f"{pct:>6} {roof.get('bound', '-'):<8} {r.calls_per_request or '-':>5}"
            )
            for reason in r.reasons:
                lines.append(f"    ! {reason}")
            for warning in r.warnings:
                lines.append(f"    ? {warning}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return arrays.jsonable({
            "candidate": self.candidate,
            "baseline": self.baseline,
            "metrics": self.metrics(),
            "results": [r.to_dict() for r in self.results],
        })


def _ms(t: float | None) -> str:
    return f"{t * 1e3:.4f}" if t and math.isfinite(t) else "-"


class PerShape:
    """An implementation built per shape: `PerShape(lambda shape, dtype: ...)`.

    For models whose construction depends on the shape (hidden size, head count): the
    factory returns the callable (or RemoteFunction, e.g. `cand.construct("Model", d)`)
    to check and time on that shape.
    """

    def __init__(self, factory: Callable[[Shape, str], Any]) -> None:
        self.factory = factory

    def build(self, shape: Shape, dtype: str) -> Any:
        return self.factory(shape, dtype)


def _build(impl: Any, shape: Shape, dtype: str) -> Any:
    return impl.build(shape, dtype) if isinstance(impl, PerShape) else impl


def sweep(
    candidate: Any,
    baseline: Any,
    reference: Callable[..., Any] | PerShape,
    make_inputs: MakeInputs,
    shapes: Iterable[Shape],
    *,
    holdout: Iterable[Shape] = (),
    dtypes: Sequence[str] = ("float32",),
    flops: str | float | Callable[[Mapping[str, Any]], float] | None = None,
    bytes: str | float | Callable[[Mapping[str, Any]], float] | None = None,  # noqa: A002 - the user-facing name
    peaks: Peaks | None = None,
    check_options: Mapping[str, Any] | None = None,
    bench_options: Mapping[str, Any] | None = None,
    floor_fraction: float | None = None,
    max_plausible_speedup: float = 10.0,
    names: tuple[str, str] = ("baseline", "candidate"),
    seed: int = 0,
    incumbent: Mapping[str, float] | None = None,
    early_stop: bool = True,
) -> SweepReport:
    """Check, then time (interleaved with the baseline), then place on the roofline, per shape.

    `candidate`: a RemoteFunction (`CandidateProcess(...).function(name)`), or a PerShape
    whose factory returns one. `baseline` and `reference` are trusted and run here; either
    may be a PerShape too (a reference model built for each shape's sizes).
    A shape whose check fails is not timed. A time beyond the physical floor (needs
    `peaks` and `flops`/`bytes`) marks the shape incorrect: impossible. A speedup above
    `max_plausible_speedup` over a tuned baseline is kept but warned about.
    With check_options["out"] (an out= factory) the candidate fills preallocated buffers
    and the baseline is called as baseline(*inputs); otherwise both return their outputs
    and both pay the copy into the harness's buffer.

    Early stop (discard only): `incumbent` (default: $RATCHET_INCUMBENT_EXTRA, which the
    driver sets for a proposed candidate's own run) holds the incumbent's per-shape
    speedups from its own sweep; after each public shape the candidate's speedups so far
    are compared with them (`stats.clearly_slower`, paired by shape, on the time ratios
    to the baseline timed beside it, so drift between the two jobs cancels), and a
    clearly slower candidate is not timed further: its report says `stopped_early` and
    the judge discards it. A confirmation re-measure gets no incumbent and always runs
    the whole sweep; so does `early_stop=False`.
    """
    check_opts = dict(check_options or {})
    bench_opts = dict(bench_options or {})
    for key in ("out", "expected_dtype", "rtol", "atol", "tolerances", "allow_inplace", "perturb", "scale_range"):
        if key in check_opts:
            bench_opts.setdefault(key, check_opts[key])
    report = SweepReport(candidate=names[1], baseline=names[0])
    known = (stats.incumbent_extra() if incumbent is None else dict(incumbent)) if early_stop else {}
    index = 0
    for is_holdout, group in ((False, list(shapes)), (True, list(holdout))):
        for shape in group:
            for dtype in dtypes:
                result = _one_shape(
                    candidate, baseline, reference, make_inputs, shape, dtype, is_holdout, index, check_opts, bench_opts,
                    flops, bytes, peaks, floor_fraction, max_plausible_speedup, names, seed,
                )
                index += 1
                report.results.append(result)
                if known and not is_holdout and _clearly_slower(report.results, known):
                    report.stopped_after = index
                    return report
    return report


def _clearly_slower(results: Sequence[ShapeResult], incumbent: Mapping[str, float]) -> bool:
    """The shapes timed so far show the candidate clearly slower than the incumbent: time
    relative to the baseline (1 / speedup) paired with the incumbent's on each shape."""
    mine, theirs = [], []
    for i, r in enumerate(results):
        other = incumbent.get(f"{SHAPE_KEY}{i}")
        if r.speedup and other and other > 0:
            mine.append(1.0 / r.speedup)
            theirs.append(1.0 / other)
    return stats.clearly_slower(mine, theirs) is not None


def _one_shape(
    candidate: Any,
    baseline: Any,
    reference: Callable[..., Any] | PerShape,
    make_inputs: MakeInputs,
    shape: Shape,
    dtype: str,
    is_holdout: bool,
    index: int,
    check_opts: Mapping[str, Any],
    bench_opts: Mapping[str, Any],
    flops: Any,
    nbytes: Any,
    peaks: Peaks | None,
    floor_fraction: float | None,
    max_plausible: float,
    names: tuple[str, str],
    seed: int,
) -> ShapeResult:
    try:
        cand = _build(candidate, shape, dtype)
    except Exception as exc:  # a candidate that cannot be built for this shape fails it
        return ShapeResult(shape=dict(shape), dtype=dtype, holdout=is_holdout, correct=False, reasons=[f"building the candidate failed: {type(exc).__name__}: {exc}"])
    base = _build(baseline, shape, dtype)
    ref: Callable[..., Any] = _build(reference, shape, dtype)  # a shape-dependent reference model: PerShape too
    case = check_case(cand, ref, make_inputs, shape, dtype, seed=seed, holdout=is_holdout, case_index=index, **check_opts)
    result = ShapeResult(shape=dict(shape), dtype=dtype, holdout=is_holdout, correct=case.ok, reasons=list(case.reasons), check=case.to_dict())
    if not case.ok:
        return result
    cmp = compare(base, cand, make_inputs, shape, dtype, reference=ref, names=names, seed=seed + index + 1, **bench_opts)
    result.time_s = cmp.b.median_s
    result.baseline_time_s = cmp.a.median_s
    result.speedup = cmp.speedup
    result.speedup_sem_rel = cmp.speedup_sem_rel
    result.time_sem_rel = cmp.b.sem_rel
    result.precise = cmp.b.converged or cmp.speedup_sem_rel < bench_opts.get("target_sem", 0.01)
    result.significant = cmp.significant
    result.host_overhead_per_call_s = cmp.b.host_overhead_per_call_s
    result.calls_per_request = cmp.b.calls
    result.verified_calls = cmp.b.verified
    if not cmp.ok:
        result.correct = False
        result.reasons += cmp.a.reasons + cmp.b.reasons
        return result
    if peaks is not None and (flops is not None or nbytes is not None):
        point = assess(
            cmp.b.median_s,
            evaluate(flops, shape, dtype) if flops is not None else 0.0,
            evaluate(nbytes, shape, dtype) if nbytes is not None else 0.0,
            peaks,
            dtype,
            floor_fraction=floor_fraction,
        )
        result.roofline = point.to_dict()
        if point.impossible:
            result.correct = False
            result.reasons.append(point.reason)
    if result.speedup and result.speedup > max_plausible:
        result.warnings.append(f"speedup {result.speedup:.1f}x over the baseline is implausible (> {max_plausible:g}x): inspect by hand")
    return result


def format_metrics(metrics: Mapping[str, Any]) -> list[str]:
    """`name: value` lines: booleans as true/false, floats with 6 significant digits."""
    lines = []
    for name, value in metrics.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, float):
            text = f"{value:.6g}" if math.isfinite(value) else ("inf" if value > 0 else "-inf" if value < 0 else "nan")
        else:
            text = str(value)
        lines.append(f"{name}: {text}")
    return lines


def ordered_metrics(report: SweepReport | Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`correct` first, then the headline metrics; None values dropped."""
    metrics = dict(report.metrics() if isinstance(report, SweepReport) else report)
    if extra:
        metrics.update(extra)
    metrics = {k: v for k, v in metrics.items() if v is not None}
    ordered: dict[str, Any] = {k: metrics[k] for k in ("correct", "speedup", "time_ms")
                               if k in metrics}
    ordered.update({k: v for k, v in metrics.items() if k not in ordered})
    return ordered


def emit(report: SweepReport | Mapping[str, Any], *, extra: Mapping[str, Any] | None = None, echo: bool = True) -> dict[str, Any]:
    """Report the metrics through the trusted channel (`ratchet.evaluator.channel.report`).

    The worker reads them from a pipe only this process holds; with `echo` they are also
    printed as `name: value` lines for people (and for running by hand). Returns them.
    """
    ordered = ordered_metrics(report, extra)
    channel.report(ordered, echo=echo)
    return ordered


class _CallableModule(types.ModuleType):
    """`import ratchet.evaluator.kernels.sweep` gives this module; `rk.sweep(...)` still runs a sweep."""

    def __call__(self, *args: Any, **kwargs: Any) -> SweepReport:
        return sweep(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
