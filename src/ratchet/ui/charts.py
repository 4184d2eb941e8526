"""The metric chart's companions: the overview's chart with its log-scale switch (the
static report) or its link to the zoomable one, the zoomable chart itself (the live app's
`/metric`: a log scale and a zoom, typed or dragged), and the phases per candidate.

Inline SVG made on the server (`svg.py`), like every chart of the pages: it renders under
the report's CSP, which allows no script, and under the live page's, which allows only
the server's own; a point is an SVG `<a>` to its candidate, so a click opens it in either.
The knobs' charts are in `knobs.py`, the slots' and throughput's in `slots.py`.
"""

from __future__ import annotations

import math
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ratchet.core.candidate import Candidate
from ratchet.ui.blocks import PHASE_COLORS, SMALL_CHART_POINTS, metric_chart, thin
from ratchet.ui.svg import Axis, Chart, _e, fmt

if TYPE_CHECKING:
    from ratchet.ui.blocks import Site, Snapshot


# ---------------------------------------------------------------------------------------
# the metric chart's neighbours


def overview_metric(snap: Snapshot, site: Site) -> str:
    """The overview's metric chart. Live, a link to /metric (log scale, zoom); in the
    static report, which runs no script, a log-scale switch made of a checkbox and CSS:
    both scales are drawn and the box shows one (where every value is positive)."""
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
                     attrs=[{"data-id": c.id} for c in mine],
                     links=[site.candidate(c.id) for c in mine])
    return chart.render()


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
