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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np

from . import arrays
from .correctness import CaseResult, MakeInputs, Shape, check_case, shape_key
from .roofline import Peaks, assess, evaluate
from .timing import compare

HOLDOUT_ENV = "RATCHET_HOLDOUT"


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
    significant: bool | None = None
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


@dataclass
class SweepReport:
    results: list[ShapeResult] = field(default_factory=list)
    candidate: str = "candidate"
    baseline: str = "baseline"

    @property
    def correct(self) -> bool:
        return bool(self.results) and all(r.correct for r in self.results)

    @property
    def failures(self) -> list[ShapeResult]:
        return [r for r in self.results if not r.correct]

    def geomean_speedup(self, holdout: bool | None = None) -> float:
        """Geometric mean over the (public / hold-out / all) shapes; 0 if any failed."""
        chosen = [r for r in self.results if holdout is None or r.holdout == holdout]
        if not chosen or not all(r.correct for r in chosen):
            return 0.0
        return geomean(r.speedup for r in chosen if r.speedup is not None)

    def metrics(self) -> dict[str, Any]:
        """The `name: value` metrics an evaluator prints (speedup is the study metric)."""
        times = [r.time_s for r in self.results if r.time_s]
        m: dict[str, Any] = {
            "correct": self.correct,
            "speedup": self.geomean_speedup(),
            "time_ms": geomean(t * 1e3 for t in times) if self.correct and times else math.inf,
            "shapes": len(self.results),
            "shapes_failed": len(self.failures),
        }
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
        warnings = sum(len(r.warnings) for r in self.results)
        if warnings:
            m["warnings"] = warnings
        return m

    def table(self) -> str:
        """A fixed-width per-shape table for logs and reports."""
        head = f"{'shape':<28} {'dtype':<9} {'set':<7} {'ok':<3} {'base ms':>10} {'cand ms':>10} {'speedup':>8} {'%roof':>6} {'bound':<8}"
        lines = [head, "-" * len(head)]
        for r in self.results:
            roof = r.roofline or {}
            pct = f"{roof['pct_of_bound']:.1f}" if roof.get("pct_of_bound") is not None else "-"
            lines.append(
                f"{shape_key(r.shape):<28} {r.dtype:<9} {'holdout' if r.holdout else 'public':<7} "
                f"{'yes' if r.correct else 'NO':<3} "
                f"{_ms(r.baseline_time_s):>10} {_ms(r.time_s):>10} "
                f"{(f'{r.speedup:.3f}' if r.speedup else '-'):>8} "
                f"{pct:>6} {roof.get('bound', '-'):<8}"
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
    return f"{t * 1e3:.4f}" if t else "-"


def sweep(
    candidate: Callable[..., Any],
    baseline: Callable[..., Any],
    reference: Callable[..., Any],
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
    floor_fraction: float = 0.5,
    overhead_factor: float = 4.0,
    max_plausible_speedup: float = 10.0,
    names: tuple[str, str] = ("baseline", "candidate"),
    seed: int = 0,
) -> SweepReport:
    """Check, then time (interleaved with the baseline), then place on the roofline, per shape.

    A shape whose check fails is not timed. A time below `floor_fraction` x the roofline
    minimum (needs `peaks` and `flops`/`bytes`) marks the shape incorrect: impossible. A
    speedup above `max_plausible_speedup` over a tuned baseline is kept but warned about.
    With check_options["out"] (an out= factory) the candidate is timed filling one
    preallocated buffer; the baseline is always called as baseline(*inputs).
    """
    check_opts = dict(check_options or {})
    bench_opts = {"cache": "rotate", "max_time_s": 2.0, **(bench_options or {})}
    report = SweepReport(candidate=names[1], baseline=names[0])
    index = 0
    for is_holdout, group in ((False, list(shapes)), (True, list(holdout))):
        for shape in group:
            for dtype in dtypes:
                case = check_case(candidate, reference, make_inputs, shape, dtype, seed=seed, holdout=is_holdout, case_index=index, **check_opts)
                index += 1
                report.results.append(_time_shape(case, candidate, baseline, make_inputs, shape, dtype, is_holdout, check_opts, bench_opts, flops, bytes, peaks, (floor_fraction, overhead_factor), max_plausible_speedup, names, seed + index))
    return report


def _time_shape(
    case: CaseResult,
    candidate: Callable[..., Any],
    baseline: Callable[..., Any],
    make_inputs: MakeInputs,
    shape: Shape,
    dtype: str,
    is_holdout: bool,
    check_opts: Mapping[str, Any],
    bench_opts: Mapping[str, Any],
    flops: Any,
    nbytes: Any,
    peaks: Peaks | None,
    roof_options: tuple[float, float],
    max_plausible: float,
    names: tuple[str, str],
    seed: int,
) -> ShapeResult:
    result = ShapeResult(shape=dict(shape), dtype=dtype, holdout=is_holdout, correct=case.ok, reasons=list(case.reasons), check=case.to_dict())
    if not case.ok:
        return result
    rng = np.random.default_rng([seed, 7])

    def make() -> tuple[Any, ...]:
        return arrays.as_tuple(make_inputs(shape, dtype, rng))

    timed = candidate
    factory = check_opts.get("out")
    if factory is not None:
        buffer = factory(shape, dtype, make())

        def timed(*args: Any) -> Any:
            return candidate(*args, out=buffer)

    cmp = compare(baseline, timed, make_inputs=make, names=names, seed=seed, **bench_opts)
    result.time_s = cmp.b.median_s
    result.baseline_time_s = cmp.a.median_s
    result.speedup = cmp.speedup
    result.significant = cmp.significant
    if not cmp.ok:
        result.correct = False
        result.reasons += cmp.a.reasons + cmp.b.reasons
    if peaks is not None and (flops is not None or nbytes is not None):
        point = assess(
            cmp.b.median_s,
            evaluate(flops, shape, dtype) if flops is not None else 0.0,
            evaluate(nbytes, shape, dtype) if nbytes is not None else 0.0,
            peaks,
            dtype,
            floor_fraction=roof_options[0],
            overhead_factor=roof_options[1],
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


def emit(
    report: SweepReport | Mapping[str, Any],
    *,
    stream: IO[str] | None = None,
    result_path: str | os.PathLike[str] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Print the metric lines (evaluator output format) and write JSON to $RATCHET_RESULT.

    `correct` comes first and `speedup` second, so a reader of the log sees them at once.
    Returns the metrics printed.
    """
    metrics = dict(report.metrics() if isinstance(report, SweepReport) else report)
    if extra:
        metrics.update(extra)
    ordered = {k: metrics[k] for k in ("correct", "speedup", "time_ms") if k in metrics}
    ordered.update({k: v for k, v in metrics.items() if k not in ordered})
    out = stream or sys.stdout
    for line in format_metrics(ordered):
        print(line, file=out)
    out.flush()
    path = result_path or os.environ.get("RATCHET_RESULT")
    if path:
        payload: dict[str, Any] = {"metrics": ordered}
        if isinstance(report, SweepReport):
            payload["report"] = report.to_dict()
        Path(path).write_text(json.dumps(arrays.jsonable(payload), indent=2))
    return ordered
