"""The tuner's knobs, each on its own scale: a slice plot per knob (the metric against its
values) and parallel coordinates (every trial across all knobs), then Optuna's parameter
importance. Log knobs lie on log axes over their whole low..high range; choices
(numbers in their order, booleans, words as written) as categories.

Inline SVG (`svg.py`); each point and line is an SVG `<a>` to its candidate. Knob values
come from proposers: every text is escaped (`_e`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ratchet.core.candidate import Candidate
from ratchet.core.vocab import Kind, Status
from ratchet.ui import blocks
from ratchet.ui.blocks import COLORS, table, td, thin
from ratchet.ui.svg import Axis, Chart, _e, fmt, log_ticks, nice_ticks

if TYPE_CHECKING:
    from ratchet.ui.blocks import Site, Snapshot, StudyLike



@dataclass(frozen=True)
class KnobScale:
    """How one knob's values lie on an axis: categories (choices: numbers, booleans,
    strings), a log range (log = true), or a linear one."""

    name: str
    categories: tuple[str, ...] = ()
    log: bool = False
    low: float = 0.0
    high: float = 1.0

    @classmethod
    def of(cls, name: str, knob: Any, values: Sequence[Any]) -> KnobScale:
        if getattr(knob, "choices", None) is not None:
            choices = list(knob.choices)
            numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in choices)
            ordered = sorted(choices) if numeric else choices  # numbers in their order
            return cls(name, categories=tuple(label(v) for v in ordered))
        nums = [float(v) for v in values if is_number(v)]
        low = float(knob.low) if knob.low is not None else min(nums, default=0.0)
        high = float(knob.high) if knob.high is not None else max(nums, default=1.0)
        return cls(name, log=bool(knob.log) and low > 0, low=low, high=high)

    def position(self, value: Any) -> float | None:
        """Where `value` lies: a category's index, or the value itself; None off the scale."""
        if self.categories:
            text = label(value)
            return float(self.categories.index(text)) if text in self.categories else None
        if not is_number(value) or (self.log and float(value) <= 0):
            return None
        return float(value)

    def unit(self, value: Any) -> float | None:
        """`value` on 0..1 of this axis (parallel coordinates)."""
        at = self.position(value)
        if at is None:
            return None
        if self.categories:
            return (at + 0.5) / len(self.categories)
        lo, hi, v = self.low, self.high, at
        if self.log:
            lo, hi, v = math.log10(lo), math.log10(hi), math.log10(v)
        return 0.5 if hi == lo else min(1.0, max(0.0, (v - lo) / (hi - lo)))

    def ticks(self) -> list[tuple[float, str]]:
        """(0..1, text) of the ticks along this axis."""
        if self.categories:
            return [((i + 0.5) / len(self.categories), c) for i, c in enumerate(self.categories)]
        if self.log:
            values = log_ticks(math.log10(self.low), math.log10(self.high))
        else:
            values = nice_ticks(self.low, self.high, 4)
        return [(u, fmt(v)) for v in values if (u := self.unit(v)) is not None
                and self.low <= v <= self.high]

    def axis(self) -> Axis:
        """The knob's whole range (where in its space the trials lie), a little padded."""
        if self.categories:
            return Axis(categories=self.categories)
        if self.log:
            pad = 10 ** (0.03 * math.log10(self.high / self.low))
            return Axis(log=True, limits=(self.low / pad, self.high * pad))
        pad = 0.03 * (self.high - self.low)
        return Axis(limits=(self.low - pad, self.high + pad))


def is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def label(value: Any) -> str:
    """A knob value as the config writes it (booleans lower case)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return fmt(value) if isinstance(value, float) else str(value)


def jitter(cand_id: str) -> float:
    """A small fixed offset for points sharing a category (the same on every render)."""
    return (sum(map(ord, cand_id)) % 7 - 3) * 0.05


def tuner_view(study: StudyLike, snap: Snapshot, site: Site) -> str:
    """The metric against each knob (a slice plot: each knob on its own scale), every
    trial across all knobs (parallel coordinates), and Optuna's parameter importances."""
    knobs = dict(getattr(study.config.tune, "knobs", {}) or {})
    trials = [(c, c.params) for c in snap.cands if c.kind == Kind.CANDIDATE and c.metric is not None
              and isinstance(c.params, dict) and c.status in (Status.KEEP, Status.DISCARD)
              and all(k in c.params for k in knobs)]
    if not knobs or not trials:
        return ""
    drawn = [c for c in blocks.thin([c for c, _ in trials], lambda c: c.metric or 0.0,
                                   lambda c: c.status == Status.KEEP, blocks.SMALL_CHART_POINTS)]
    scales = {k: KnobScale.of(k, knob, [c.params.get(k) for c in drawn if c.params])
              for k, knob in knobs.items()}
    out = ["<h2>Tuner: metric against each knob</h2>",
           '<p class="note">each knob on its own scale: log knobs on a log axis, choices '
           "(numbers, booleans, words) as categories; a point opens its candidate.</p>"]
    for scale in scales.values():
        out.append(f'<div class="slice" style="display:inline-block;width:48%;min-width:380px">'
                   f"{slice_plot(snap, site, scale, drawn)}</div>")
    out.append(parallel_coordinates(snap, site, list(scales.values()), drawn))
    out.append(importance(knobs, trials, snap.goal))
    return "".join(out)


def slice_plot(snap: Snapshot, site: Site, scale: KnobScale, drawn: list[Candidate]) -> str:
    key = scale.name
    chart = Chart(title=f"{snap.metric} against {key}", xlabel=key + (" (log)" if scale.log else ""),
                  ylabel=snap.metric, width=460, height=260, x=scale.axis())
    for status in (Status.DISCARD, Status.KEEP):
        sel = [(at, c) for c in drawn if c.status == status
               and (at := scale.position((c.params or {}).get(key))) is not None]
        xs = [at + (jitter(c.id) if scale.categories else 0.0) for at, c in sel]
        chart.points(xs, [c.metric or 0.0 for _, c in sel],
                     COLORS[status],
                     label=f"{status} ({len(sel)})",
                     titles=[f"{c.id}: {key}={label((c.params or {}).get(key))} "
                             f"{snap.metric} {c.metric:.6g}" for _, c in sel],
                     attrs=[{"data-id": c.id, "data-knob": key,
                             "data-value": label((c.params or {}).get(key))} for _, c in sel],
                     links=[site.candidate(c.id) for _, c in sel])
    return chart.render()


PC_WIDTH, PC_HEIGHT, PC_TOP, PC_BOTTOM, PC_SIDE = 960, 320, 40, 30, 70
PC_LINES = 150  # the most trials drawn as lines (the keeps and the envelope)


def parallel_coordinates(snap: Snapshot, site: Site, scales: list[KnobScale],
                         drawn: list[Candidate]) -> str:
    """One vertical axis per knob (its own scale) and the metric's last; each trial a line
    through its values, a link to its candidate. Drawn for two knobs or more (one knob's
    slice says it all), with at most PC_LINES lines: the keeps and the envelope."""
    if len(scales) < 2:
        return ""
    drawn = thin(drawn, lambda c: c.metric or 0.0, lambda c: c.status == Status.KEEP, PC_LINES)
    values = [c.metric for c in drawn if c.metric is not None]
    if not values:
        return ""
    lo, hi = min(values), max(values)
    metric_scale = KnobScale(snap.metric, log=lo > 0 and hi / lo > 20, low=lo, high=hi)
    axes = [*scales, metric_scale]
    step = (PC_WIDTH - 2 * PC_SIDE) / max(1, len(axes) - 1)
    height = PC_HEIGHT - PC_TOP - PC_BOTTOM

    def y_of(u: float) -> float:
        return PC_TOP + (1 - u) * height

    out = [f'<svg class="chart parallel" role="img" viewBox="0 0 {PC_WIDTH} {PC_HEIGHT}" '
           'width="100%" preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg">'
           f"<title>{_e('parallel coordinates: every trial across the knobs')}</title>"]
    for i, scale in enumerate(axes):
        x = PC_SIDE + i * step
        kind = "categories" if scale.categories else "log" if scale.log else "linear"
        out.append(f'<g class="pc-axis" data-knob="{_e(scale.name)}" data-scale="{kind}">'
                   f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{PC_TOP}" y2="{PC_TOP + height}" '
                   f'stroke="#757575"/><text x="{x:.1f}" y="{PC_TOP - 14}" text-anchor="middle" '
                   f'class="axis">{_e(scale.name)}{" (log)" if scale.log else ""}</text>')
        for u, text in scale.ticks():
            out.append(f'<text x="{x + 5:.1f}" y="{y_of(u) + 4:.1f}" class="tick">{_e(text)}</text>')
        out.append("</g>")
    # the discards first, so the keeps are drawn over them
    for cand in sorted(drawn, key=lambda c: c.status == Status.KEEP):
        units = [s.unit((cand.params or {}).get(s.name)) for s in scales]
        units.append(metric_scale.unit(cand.metric))
        if any(u is None for u in units):
            continue
        d = "M" + "L".join(f"{PC_SIDE + i * step:.1f},{y_of(u or 0.0):.1f}"
                           for i, u in enumerate(units))
        keep = cand.status == Status.KEEP
        text = ", ".join(f"{s.name}={label((cand.params or {}).get(s.name))}" for s in scales)
        out.append(f'<a href="{_e(site.candidate(cand.id))}">'
                   f'<path class="pc-line" d="{d}" fill="none" data-id="{_e(cand.id)}" '
                   f'stroke="{COLORS[cand.status]}" '
                   f'stroke-width="{3 if keep else 1.6}" opacity="0.8"><title>'
                   f"{_e(cand.id)} {_e(cand.status)}: {_e(text)}; {_e(snap.metric)} "
                   f"{cand.metric:.6g}</title></path></a>")
    out.append("</svg>")
    return "<h3>Parallel coordinates</h3>" + "".join(out)


def importance(knobs: dict[str, Any], trials: list[tuple[Candidate, dict]], goal: str) -> str:
    """Optuna's own importance evaluator over the tuner's trials, as recorded."""
    if len(trials) < 3 or len(knobs) < 2:
        return ('<p class="note">parameter importance needs at least 3 measured trials and '
                "2 knobs.</p>")
    try:
        import optuna
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        dists: dict[str, Any] = {}
        for key, knob in knobs.items():
            if knob.choices is not None:
                dists[key] = CategoricalDistribution(list(knob.choices))
            elif knob.is_int:
                dists[key] = IntDistribution(int(knob.low), int(knob.high), log=knob.log)
            else:
                dists[key] = FloatDistribution(float(knob.low), float(knob.high), log=knob.log)
        study = optuna.create_study(direction="minimize" if goal == "minimize" else "maximize")
        for cand, params in trials:
            study.add_trial(optuna.trial.create_trial(
                params={k: params[k] for k in knobs}, distributions=dists, value=cand.metric))
        scores = optuna.importance.get_param_importances(study)
    except Exception as exc:  # noqa: BLE001 - a view must never fail the page
        return f'<p class="note">parameter importance unavailable: {_e(type(exc).__name__)}: {_e(exc)}</p>'
    rows = [[td(f"<code>{_e(k)}</code>"), td(f"{v:.3f}", "num")] for k, v in scores.items()]
    return ("<h3>Parameter importance (Optuna's default evaluator)</h3>"
            + table(["knob", "importance"], rows, table_id="importance"))
