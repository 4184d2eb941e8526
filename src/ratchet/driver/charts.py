"""The dashboard's charts beyond the metric chart: the tuner's knobs (a slice plot per
knob and parallel coordinates), the slots over time, and candidates finished per hour.

Each is inline SVG made on the server (`svg.py`), like every chart of the pages: it
renders under the report's CSP, which allows no script, and under the live page's, which
allows only the server's own; a point or a job bar is an SVG `<a>` to its candidate, so
a click opens it in either. Every text is escaped (`_e`): knob values and descriptions
come from proposers.
"""

from __future__ import annotations

import math
import re
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ratchet.driver.ledger import Candidate
from ratchet.driver.svg import Axis, Chart, _e, fmt, log_ticks, nice_ticks
from ratchet.vocab import Kind, Status

if TYPE_CHECKING:
    from ratchet.driver.pages import Site, Snapshot, StudyLike

JOB_COLORS = {"candidate": "#1565c0", "confirming": "#8e24aa", "baseline": "#00897b",
              "running": "#ffb300"}


# ---------------------------------------------------------------------------------------
# the metric chart's neighbours


def overview_metric(snap: Snapshot, site: Site) -> str:
    """The overview's metric chart. Live, a link to /metric (log scale, zoom); in the
    static report, which runs no script, a log-scale switch made of a checkbox and CSS:
    both scales are drawn and the box shows one (where every value is positive)."""
    from ratchet.driver.pages import metric_chart

    values = [c.metric for c in snap.cands if c.metric is not None]
    if site.live or not values or min(values) <= 0:
        return metric_chart(snap, site) + zoom_link(site)
    checked = " checked" if max(values) / min(values) > 20 else ""
    return (f'<input type="checkbox" id="log-switch" class="scale-switch"{checked}>'
            '<label for="log-switch" id="log-switch-label"> log scale</label>'
            f'<div class="linear-chart">{metric_chart(snap, site, log_y=False)}</div>'
            f'<div class="log-chart">{metric_chart(snap, site, log_y=True)}</div>'
            + zoom_link(site))


def zoom_link(site: Site) -> str:
    """Under the overview's metric chart: what a click does, and the page that zooms."""
    href = site.metric()
    return (f'<p class="note">a point opens its candidate; <a id="open-metric" href="{_e(href)}">'
            "this chart with a log scale and zoom</a></p>" if href else
            '<p class="note">a point opens its candidate.</p>')



def phase_chart(cands: list[Candidate], site: Site) -> str:
    """Seconds per phase for each candidate that ran: one line per phase."""
    from ratchet.driver.pages import PHASE_COLORS, SMALL_CHART_POINTS, thin

    ran = [c for c in cands if c.phases]
    if not ran:
        return ""
    names = list(dict.fromkeys(str(p.get("name", "?")) for c in ran for p in c.phases or []))
    # a bounded number of points: the envelope of the candidates' total phase time
    ran = thin(ran, lambda c: sum(float(p.get("seconds") or 0) for p in c.phases or []),
               limit=SMALL_CHART_POINTS)
    chart = Chart(title="phase durations per candidate", xlabel="candidate, in the order proposed",
                  ylabel="seconds", height=240, x=Axis(integer=True))
    for i, name in enumerate(names):
        mine = [c for c in ran if any(str(p.get("name")) == name for p in c.phases or [])]
        ys = [sum(float(p.get("seconds") or 0) for p in c.phases or [] if str(p.get("name")) == name)
              for c in mine]
        chart.points([c.seq for c in mine], ys, PHASE_COLORS[i % len(PHASE_COLORS)],
                     label=name, size=3.5,
                     titles=[f"{c.id} {name}: {y:.2f} s" for c, y in zip(mine, ys, strict=True)],
                     attrs=[{"data-id": c.id, "data-phase": name} for c in mine],
                     links=[site.candidate(c.id) for c in mine])
    return chart.render()


# ---------------------------------------------------------------------------------------
# the tuner's knobs, each on its own scale


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
    from ratchet.driver import pages

    knobs = dict(getattr(study.config.tune, "knobs", {}) or {})
    trials = [(c, c.params) for c in snap.cands if c.kind == Kind.CANDIDATE and c.metric is not None
              and isinstance(c.params, dict) and c.status in (Status.KEEP, Status.DISCARD)
              and all(k in c.params for k in knobs)]
    if not knobs or not trials:
        return ""
    drawn = [c for c in pages.thin([c for c, _ in trials], lambda c: c.metric or 0.0,
                                   lambda c: c.status == Status.KEEP, pages.SMALL_CHART_POINTS)]
    scales = {k: KnobScale.of(k, knob, [c.params.get(k) for c in drawn if c.params])
              for k, knob in knobs.items()}
    out = ["<h2>Tuner: metric against each knob</h2>",
           '<p class="note">each knob on its own scale: log knobs on a log axis, choices '
           "(numbers, booleans, words) as categories; a point opens its candidate.</p>"]
    for scale in scales.values():
        out.append(f'<div class="slice" style="display:inline-block;width:48%;min-width:380px">'
                   f"{slice_plot(snap, site, scale, drawn)}</div>")
    out.append(parallel_coordinates(snap, site, list(scales.values()), drawn))
    out.append(pages.importance(knobs, trials, snap.goal))
    return "".join(out)


def slice_plot(snap: Snapshot, site: Site, scale: KnobScale, drawn: list[Candidate]) -> str:
    from ratchet.driver.pages import COLORS

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


def parallel_coordinates(snap: Snapshot, site: Site, scales: list[KnobScale],
                         drawn: list[Candidate]) -> str:
    """One vertical axis per knob (its own scale) and the metric's last; each trial a line
    through its values, a link to its candidate."""
    from ratchet.driver.pages import COLORS

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
        out.append(f'<a href="{_e(site.candidate(cand.id))}" class="point-link">'
                   f'<path class="pc-line" d="{d}" fill="none" data-id="{_e(cand.id)}" '
                   f'stroke="{COLORS[cand.status]}" '
                   f'stroke-width="{3 if keep else 1.6}" opacity="0.8"><title>'
                   f"{_e(cand.id)} {_e(cand.status)}: {_e(text)}; {_e(snap.metric)} "
                   f"{cand.metric:.6g}</title></path></a>")
    out.append("</svg>")
    return "<h3>Parallel coordinates</h3>" + "".join(out)


# ---------------------------------------------------------------------------------------
# the slots over time


@dataclass(frozen=True)
class Job:
    cand: Candidate
    lane: str
    start: float
    end: float
    kind: str  # JOB_COLORS' keys


def job_kind(cand: Candidate) -> str:
    if cand.status == Status.SUBMITTED:
        return "running"
    if cand.kind == Kind.CONFIRM or cand.confirms:
        return "confirming"
    return "candidate" if cand.kind == Kind.CANDIDATE else "baseline"


def jobs_of(rows: Sequence[Candidate], now: float) -> tuple[list[Job], bool]:
    """Each job that ran (or runs) with its slot, start and end: it started when a slot
    took it (submitted + queue time) and ended when it finished. A job whose backend
    recorded no slot is placed in a lane of its own by packing (the first lane free at its
    start); the second value says whether any was."""
    timed = []
    for c in rows:
        if c.submitted_at is None:
            continue
        end = c.finished_at if c.finished_at is not None else (
            now if c.status == Status.SUBMITTED else None)
        if end is None:
            continue
        start = c.submitted_at + (c.queue_s or 0.0)
        timed.append((c, min(start, end), end))
    jobs: list[Job] = []
    packed = False
    lanes: list[float] = []  # the end of each packed lane's last job
    for c, start, end in sorted(timed, key=lambda t: t[1]):
        lane = c.slot
        if not lane:
            packed = True
            free = next((i for i, busy_until in enumerate(lanes) if busy_until <= start), None)
            if free is None:
                lanes.append(end)
                free = len(lanes) - 1
            lanes[free] = end
            lane = f"lane {free + 1}"
        jobs.append(Job(c, lane, start, end, job_kind(c)))
    return jobs, packed


def natural(text: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", text)]


def union_seconds(spans: list[tuple[float, float]]) -> float:
    total, reach = 0.0, -math.inf
    for a, b in sorted(spans):
        if b > reach:
            total += b - max(a, reach)
            reach = b
    return total


TL_WIDTH, TL_LANE, TL_LEFT, TL_RIGHT = 960, 26, 90, 110
TIMELINE_JOBS = 600  # the most job bars drawn (the latest): the SVG stays small


def slot_timeline(snap: Snapshot, site: Site) -> str:
    """Which job ran in which slot over time: candidates, confirmation pairs, the
    baseline and re-measures, running jobs; the gaps are idle slot time."""
    jobs, packed = jobs_of(snap.everything, snap.now)
    if not jobs:
        return ""
    total, first = len(jobs), min(j.start for j in jobs)
    if total > TIMELINE_JOBS:  # a bounded drawing: the latest jobs, and said so
        jobs = sorted(jobs, key=lambda j: j.end)[-TIMELINE_JOBS:]
    t0, t1 = min(j.start for j in jobs), max(j.end for j in jobs)
    span = max(t1 - t0, 1e-6)
    lanes = sorted({j.lane for j in jobs}, key=natural)
    top = 34
    height = top + TL_LANE * len(lanes) + 34
    plot = TL_WIDTH - TL_LEFT - TL_RIGHT
    unit, per = (("min", 60.0) if span >= 180 else ("s", 1.0)) if span < 3 * 3600 else ("h", 3600.0)

    def sx(t: float) -> float:
        return TL_LEFT + (t - t0) / span * plot

    out = [f'<svg class="chart timeline" role="img" viewBox="0 0 {TL_WIDTH} {height}" '
           'width="100%" preserveAspectRatio="xMinYMin meet" xmlns="http://www.w3.org/2000/svg">'
           "<title>slots over time</title>"]
    x = float(TL_LEFT)
    for kind, color in JOB_COLORS.items():
        out.append(f'<rect x="{x:.0f}" y="6" width="12" height="12" fill="{color}"/>'
                   f'<text x="{x + 16:.0f}" y="16" class="legend">{_e(kind)}</text>')
        x += 30 + 6.2 * len(kind)
    out.append(f'<rect x="{x:.0f}" y="6" width="12" height="12" fill="#f5f5f5" stroke="#bdbdbd"/>'
               f'<text x="{x + 16:.0f}" y="16" class="legend">idle</text>')
    for t in nice_ticks(0.0, span / per, 8):
        tx = sx(t0 + t * per)
        out.append(f'<line x1="{tx:.1f}" x2="{tx:.1f}" y1="{top}" y2="{height - 30}" stroke="#eee"/>'
                   f'<text x="{tx:.1f}" y="{height - 14}" text-anchor="middle" class="tick">'
                   f"{_e(fmt(t))}</text>")
    out.append(f'<text x="{TL_LEFT + plot / 2:.0f}" y="{height - 1}" text-anchor="middle" '
               f'class="axis">{_e(f"time since the first job started ({unit})")}</text>')
    for i, lane in enumerate(lanes):
        y = top + i * TL_LANE
        mine = [j for j in jobs if j.lane == lane]
        idle = 1 - union_seconds([(j.start, j.end) for j in mine]) / span
        out.append(f'<g class="lane" data-slot="{_e(lane)}" data-idle="{idle:.4f}">'
                   f'<rect x="{TL_LEFT}" y="{y + 3}" width="{plot}" height="{TL_LANE - 6}" '
                   f'fill="#f5f5f5" stroke="#e0e0e0"/><text x="{TL_LEFT - 6}" y="{y + 17}" '
                   f'text-anchor="end" class="tick">{_e(lane)}</text>'
                   f'<text x="{TL_LEFT + plot + 6}" y="{y + 17}" class="tick">idle {idle:.0%}</text>')
        for j in mine:
            c = j.cand
            w = max(sx(j.end) - sx(j.start), 1.5)
            what = f"confirms {c.confirms}" if c.confirms else c.description
            out.append(f'<a href="{_e(site.candidate(c.id))}" class="point-link"><rect class="job" '
                       f'data-id="{_e(c.id)}" data-kind="{j.kind}" data-slot="{_e(lane)}" '
                       f'data-start="{j.start - t0:.3f}" data-end="{j.end - t0:.3f}" '
                       f'x="{sx(j.start):.1f}" y="{y + 4}" width="{w:.1f}" height="{TL_LANE - 8}" '
                       f'fill="{JOB_COLORS[j.kind]}" stroke="#fff" stroke-width="0.5"><title>'
                       f"{_e(c.id)} {_e(j.kind)} in {_e(lane)}: {j.start - t0:.1f}–"
                       f"{j.end - t0:.1f} s, {_e(c.status)}: {_e(what)}</title></rect></a>")
        out.append("</g>")
    out.append("</svg>")
    note = ('<p class="note" id="timeline-packed">some jobs name no slot (their backend records '
            "none): they are placed in lanes by packing their start and end times, the first "
            "lane free at each start.</p>" if packed else "")
    if total > len(jobs):
        note += (f'<p class="note" data-thinned="{len(jobs)}">the latest {len(jobs):,} of '
                 f"{total:,} jobs drawn: from {t0 - first:,.0f} s after the first job started.</p>")
    return ("<h2>Slots over time</h2>"
            '<p class="note">each job from when a slot took it to when it finished; a bar opens '
            "its candidate (a confirmation pair's side opens its own page). Gaps are idle slot "
            "time, the time between sessions included.</p>" + "".join(out) + note)


# ---------------------------------------------------------------------------------------
# throughput over time


BIN_SECONDS = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800,
               21600, 43200, 86400)


def throughput_bins(finished: list[float], start: float, end: float, bins: int = 24
                    ) -> tuple[float, list[int]]:
    """(bin width in seconds, the count finished in each bin from `start`): the
    smallest round width giving at most `bins` bins."""
    span = max(end - start, 1e-9)
    width = float(next((b for b in BIN_SECONDS if span / b <= bins), BIN_SECONDS[-1]))
    counts = [0] * (int(span // width) + 1)
    for t in finished:
        counts[min(len(counts) - 1, max(0, int((t - start) // width)))] += 1
    return width, counts


def throughput_chart(snap: Snapshot) -> str:
    """Candidates finished per hour, in bins of time since the first job started."""
    cands = [c for c in snap.cands if c.kind == Kind.CANDIDATE and c.finished_at is not None]
    starts = [c.submitted_at for c in snap.everything if c.submitted_at is not None]
    if not cands or not starts:
        return ""
    t0 = min(starts)
    width, counts = throughput_bins([c.finished_at or t0 for c in cands], t0,
                                    max(c.finished_at or t0 for c in cands))
    hours = width / 3600
    unit, per = ("h", 3600.0) if width >= 600 else ("min", 60.0) if width >= 60 else ("s", 1.0)
    xs = [(i + 0.5) * width / per for i in range(len(counts))]
    rates = [n / hours for n in counts]
    chart = Chart(title="candidates finished per hour", xlabel=f"time since the first job "
                  f"started ({unit}); bins of {fmt(width / per)} {unit}",
                  ylabel="candidates per hour", height=240, y_from_zero=True)
    chart.line(xs, rates, "#1565c0", label="per hour, in each bin")
    chart.points(xs, rates, "#1565c0", size=3.5,
                 titles=[f"{n} finished in {fmt(i * width / per)}–{fmt((i + 1) * width / per)} "
                         f"{unit}: {r:.4g} per hour" for i, (n, r) in enumerate(zip(counts, rates,
                                                                                    strict=True))],
                 attrs=[{"data-bin": str(i), "data-count": str(n), "data-rate": f"{r:.6g}"}
                        for i, (n, r) in enumerate(zip(counts, rates, strict=True))])
    mean = len(cands) / max(hours * len(counts), 1e-9)
    chart.line([0, len(counts) * width / per], [mean, mean], "#9e9e9e", dash=True,
               label=f"mean {mean:.4g} per hour")
    return (f'<h2>Throughput over time</h2><div id="throughput" data-bin-seconds="{width:g}">'
            f"{chart.render()}</div>")



# ---------------------------------------------------------------------------------------
# the metric chart, zoomed (the live app's /metric)


@dataclass(frozen=True)
class MetricQuery:
    """What `/metric?log=1&from=10&to=40` asks: a log axis, the candidates from..to."""

    log: bool | None = None  # None: log when the values span more than 20x
    low: float | None = None
    high: float | None = None

    @classmethod
    def of(cls, query: dict[str, list[str]]) -> MetricQuery:
        one = {k: v[0] for k, v in query.items() if v}

        def number(key: str) -> float | None:
            try:
                value = float(one.get(key, ""))
            except ValueError:
                return None
            return value if math.isfinite(value) else None

        log = {"1": True, "0": False}.get(one.get("log", ""))
        low, high = number("from"), number("to")
        if low is not None and high is not None and low > high:
            low, high = high, low
        return cls(log, low, high)

    def link(self, **change: Any) -> str:
        want = {"log": self.log, "from": self.low, "to": self.high, **change}
        keep = {k: (int(v) if isinstance(v, bool) else fmt(v)) for k, v in want.items()
                if v is not None}
        return "/metric" + ("?" + urllib.parse.urlencode(keep) if keep else "")


def metric_page(snap: Snapshot, site: Site, query: MetricQuery, chart: bool = True
                ) -> tuple[str, str]:
    """(controls, chart): the metric chart with a log-scale switch (where every value is
    positive) and a zoom: drag across the chart, type a range, or step back to the whole
    study. `chart` False: the controls alone."""
    from ratchet.driver.pages import metric_chart

    values = [c.metric for c in snap.cands if c.metric is not None]
    seqs = [c.seq for c in snap.cands]
    positive = bool(values) and min(values) > 0
    auto = positive and max(values) / min(values) > 20
    log = (query.log if query.log is not None else auto) and positive
    limits = None
    if seqs and (query.low is not None or query.high is not None):
        low = query.low if query.low is not None else min(seqs)
        high = query.high if query.high is not None else max(seqs)
        limits = (low - 0.5, high + 0.5) if high - low >= 1 else (low - 1.0, high + 1.0)
    scale = (f'<a id="scale-linear" href="{_e(query.link(log=False))}">linear scale</a>' if log
             else f'<a id="scale-log" href="{_e(query.link(log=True))}">log scale</a>' if positive
             else '<span class="note" id="scale-log-off">log scale: only for positive values'
                  "</span>")
    zoomed = (f' · <a id="zoom-reset" href="{_e(query.link(**{"from": None, "to": None}))}">'
              "the whole study</a>" if limits else "")
    low_v = fmt(query.low) if query.low is not None else ""
    high_v = fmt(query.high) if query.high is not None else ""
    controls = (f'<div class="filters" id="metric-controls">{scale}{zoomed}'
                f'<label>candidates from <input id="zoom-from" type="number" size="6" '
                f'value="{_e(low_v)}"></label><label>to <input id="zoom-to" type="number" '
                f'size="6" value="{_e(high_v)}"></label><button id="zoom-apply" type="button">'
                'zoom</button><span class="note">or drag across the chart</span></div>')
    head = f"<h1>{_e(snap.metric)} over candidates</h1>{controls}"
    if not chart:
        return head, ""
    drawn = metric_chart(snap, site, log_y=log, limits=limits)
    return head, (f'<div id="metric-zoom" data-log="{int(log)}">{drawn}</div>'
                  '<p class="note">a point opens its candidate.</p>')
