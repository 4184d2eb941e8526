"""Small inline SVG charts for the dashboard and the report (no plotting library).

Inline SVG is markup, not a script or an image resource: it renders under a CSP that
allows no script, scales with the page, needs no matplotlib, and costs microseconds to
draw, so the live page can redraw it on every verdict. Every label and tooltip passes
through `_e` (candidate text is untrusted). Each mark carries `data-*` attributes with
its values, so what a reader sees can be checked against the ledger, and a mark given a
link is an SVG `<a>`: a click on a point opens its candidate, with no script (the static
report allows none).
"""

from __future__ import annotations

import hashlib
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

MARGIN = (14, 18, 46, 70)  # top, right, bottom, left (px)
DASH = 'stroke-dasharray="5 4" '


def _e(text: object) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def nice_ticks(low: float, high: float, count: int = 5, integer: bool = False) -> list[float]:
    """Round tick values covering [low, high] (1, 2, 5 x 10^k steps); `integer`: whole
    numbers only (a candidate's number has no 0.5)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return []
    if high <= low:
        return [low]
    raw = (high - low) / max(count, 1)
    if integer:
        raw = max(raw, 1.0)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(low / step) * step
    ticks, t = [], first
    while t <= high + step * 1e-9:
        ticks.append(round(t, 12))
        t += step
    return ticks


def log_ticks(low: float, high: float) -> list[float]:
    """Tick values for a log axis spanning 10^low..10^high: 1, 2, 5 x powers of ten over a
    few decades (every power over many, each digit within one); where fewer than two fall
    inside, round values as on a linear axis."""
    lo, hi = math.floor(low), math.ceil(high)
    span = high - low
    steps = range(1, 10) if span < 1 else (1, 2, 5) if span <= 3 else (1,)
    inside = [m * 10.0 ** k for k in range(lo, hi + 1) for m in steps
              if low <= math.log10(m * 10.0 ** k) <= high]
    if len(inside) >= 2:
        return inside
    return [t for t in nice_ticks(10 ** low, 10 ** high) if t > 0]


def fmt(value: float) -> str:
    return f"{value:.4g}"


@dataclass
class Mark:
    kind: str  # "point" | "bar" | "step" | "line" | "floor"
    xs: list[float]
    ys: list[float]
    color: str
    shape: str = "circle"  # circle | diamond | cross
    hollow: bool = False
    size: float = 4.5
    titles: list[str] = field(default_factory=list)
    attrs: list[dict[str, str]] = field(default_factory=list)
    lows: list[float] = field(default_factory=list)
    highs: list[float] = field(default_factory=list)
    label: str = ""
    dash: bool = False
    links: list[str] = field(default_factory=list)  # each mark's page (an SVG <a>)


@dataclass(frozen=True)
class Axis:
    """How an axis maps values: linear, log (values > 0 only), or categories (values
    are indices into `categories`, each tick labelled with its category); `integer`:
    whole-number ticks; `limits`: a fixed range (a zoom) instead of fitting the marks."""

    log: bool = False
    categories: tuple[str, ...] = ()
    integer: bool = False
    limits: tuple[float, float] | None = None

    def keeps(self, value: float) -> bool:
        return math.isfinite(value) and (value > 0 or not self.log)

    def inside(self, value: float) -> bool:
        return self.limits is None or self.limits[0] <= value <= self.limits[1]


class Chart:
    """Marks on linear, log or categorical axes; `render()` fits the axes to every mark
    (within `x.limits`, when zoomed)."""

    def __init__(self, *, title: str, xlabel: str, ylabel: str, width: int = 960,
                 height: int = 330, log_y: bool = False, css_class: str = "chart",
                 x: Axis | None = None, y_from_zero: bool = False) -> None:
        self.title, self.xlabel, self.ylabel = title, xlabel, ylabel
        self.width, self.height, self.log_y, self.css_class = width, height, log_y, css_class
        self.x = x or Axis()
        self.y_from_zero = y_from_zero and not log_y  # a rate or a count: 0 in sight
        self.marks: list[Mark] = []

    def points(self, xs: Sequence[float], ys: Sequence[float], color: str, *, label: str = "",
               shape: str = "circle", hollow: bool = False, size: float = 4.5,
               titles: Sequence[str] = (), attrs: Sequence[dict[str, str]] = (),
               links: Sequence[str] = ()) -> None:
        self.marks.append(Mark("point", list(xs), list(ys), color, shape, hollow, size,
                               list(titles), list(attrs), label=label, links=list(links)))

    def floor(self, xs: Sequence[float], color: str, *, label: str = "",
              titles: Sequence[str] = (), attrs: Sequence[dict[str, str]] = (),
              links: Sequence[str] = ()) -> None:
        """Crosses along the bottom edge: things with no value to place (a crash)."""
        self.marks.append(Mark("floor", list(xs), [], color, "cross", titles=list(titles),
                               attrs=list(attrs), label=label, links=list(links)))

    def intervals(self, xs: Sequence[float], lows: Sequence[float], highs: Sequence[float],
                  color: str) -> None:
        self.marks.append(Mark("bar", list(xs), [], color, lows=list(lows), highs=list(highs)))

    def step(self, xs: Sequence[float], ys: Sequence[float], color: str, *, label: str = "") -> None:
        self.marks.append(Mark("step", list(xs), list(ys), color, label=label))

    def line(self, xs: Sequence[float], ys: Sequence[float], color: str, *, label: str = "",
             dash: bool = False, attrs: dict[str, str] | None = None) -> None:
        self.marks.append(Mark("line", list(xs), list(ys), color, label=label, dash=dash,
                               attrs=[attrs or {}]))

    # -- drawing -------------------------------------------------------------------------

    def _ys(self) -> list[float]:
        """The y values the axis must show: those of marks inside the x range."""
        ys = []
        for m in self.marks:
            for i, x in enumerate(m.xs):
                if not self.x.inside(x):
                    continue
                ys += [v[i] for v in (m.ys, m.lows, m.highs) if i < len(v)]
        return [y for y in ys if math.isfinite(y) and (y > 0 or not self.log_y)]

    def render(self) -> str:
        xs = [x for m in self.marks for x in m.xs if self.x.keeps(x) and self.x.inside(x)]
        ys = self._ys()
        if not xs:
            return ""
        top, right, bottom, left = MARGIN
        legend, rows = self._legend_layout(left)
        top += rows * 16  # the legend sits above the plot, never over a mark
        w, h = self.width - left - right, self.height - top - bottom
        tx = math.log10 if self.x.log else float  # x in axis units
        x0, x1 = self.x.limits or (min(xs), max(xs))
        x0, x1 = tx(x0), tx(x1)
        if self.x.categories:
            x0, x1 = -0.5, len(self.x.categories) - 0.5
        elif x1 == x0:
            x0, x1 = x0 - 1, x1 + 1
        if not self.x.categories and self.x.limits is None:
            pad = (x1 - x0) * 0.03
            x0, x1 = x0 - pad, x1 + pad
        y0, y1 = (min(ys), max(ys)) if ys else (0.0, 1.0)
        if self.y_from_zero:
            y0 = min(y0, 0.0)
        if self.log_y:
            y0, y1 = math.log10(y0), math.log10(y1)
        if y1 == y0:
            y0, y1 = y0 - (abs(y0) * 0.05 or 1), y1 + (abs(y1) * 0.05 or 1)
        ypad = (y1 - y0) * 0.08
        y0, y1 = y0 - ypad, y1 + ypad

        def sx(x: float) -> float:
            return left + (tx(x) - x0) / (x1 - x0) * w

        def sy(y: float) -> float:
            v = math.log10(y) if self.log_y else y
            return top + (1 - (v - y0) / (y1 - y0)) * h

        # where the plot lies and what it spans, in data units: a drag on the live page
        # turns into a range of x (serve.SCRIPT) without asking the server
        span = (f' data-x0="{x0:.6g}" data-x1="{x1:.6g}" data-left="{left}" data-plot-width='
                f'"{w}"' if not (self.x.log or self.x.categories) else "")
        # named by what it clips: the same text for the same chart, so a live page's parts
        # stay unchanged between renders, and two charts of one geometry share a rect
        clip = "clip-" + hashlib.sha256(f"{self.title}|{left}|{top}|{w}|{h}".encode()).hexdigest()[:10]
        out = [f'<svg class="{_e(self.css_class)}" role="img" viewBox="0 0 {self.width} '
               f'{self.height}" width="100%" preserveAspectRatio="xMinYMin meet"{span} '
               f'xmlns="http://www.w3.org/2000/svg"><title>{_e(self.title)}</title>',
               f'<clipPath id="{clip}"><rect x="{left}" y="{top}" width="{w}" height="{h}"/>'
               "</clipPath>",
               f'<rect x="{left}" y="{top}" width="{w}" height="{h}" fill="#fff" '
               'stroke="#e0e0e0"/>']
        yticks = nice_ticks(y0, y1) if not self.log_y else log_ticks(y0, y1)
        for t in yticks:
            y = sy(t)
            if top <= y <= top + h:
                out.append(f'<line x1="{left}" x2="{left + w}" y1="{y:.1f}" y2="{y:.1f}" '
                           f'stroke="#eee"/><text x="{left - 6}" y="{y + 4:.1f}" '
                           f'text-anchor="end" class="tick">{_e(fmt(t))}</text>')
        for t, label in self._xticks(x0, x1):
            x = sx(t)
            if left - 0.5 <= x <= left + w + 0.5:
                out.append(f'<text x="{x:.1f}" y="{top + h + 16}" text-anchor="middle" '
                           f'class="tick xtick">{_e(label)}</text>')
        out.append(f'<text x="{left + w / 2:.0f}" y="{self.height - 8}" text-anchor="middle" '
                   f'class="axis">{_e(self.xlabel)}</text>')
        out.append(f'<text transform="translate(14 {top + h / 2:.0f}) rotate(-90)" '
                   f'text-anchor="middle" class="axis">{_e(self.ylabel)}</text>')
        out.append(f'<g clip-path="url(#{clip})">')
        for m in self.marks:
            out.extend(self._draw(m, sx, sy, top + h))
        out.append("</g>")
        out.append(legend)
        out.append("</svg>")
        return "".join(out)

    def _xticks(self, x0: float, x1: float) -> list[tuple[float, str]]:
        """(value, label) of each x tick; x0, x1 in axis units."""
        if self.x.categories:
            return [(float(i), c) for i, c in enumerate(self.x.categories)]
        if self.x.log:
            return [(t, fmt(t)) for t in log_ticks(x0, x1)]
        return [(t, fmt(t)) for t in nice_ticks(x0, x1, 8, integer=self.x.integer)]

    def _draw(self, m: Mark, sx, sy, floor_y: float) -> list[str]:  # noqa: ANN001
        out: list[str] = []
        if m.kind in ("step", "line"):
            pts = [(sx(x), sy(y)) for x, y in zip(m.xs, m.ys, strict=True)
                   if math.isfinite(y) and (y > 0 or not self.log_y) and self.x.keeps(x)]
            if not pts:
                return out
            if m.kind == "step":
                path = [f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"]
                for nx, ny in pts[1:]:
                    path.append(f"H{nx:.1f}V{ny:.1f}")
                d = "".join(path)
            else:
                d = "M" + "L".join(f"{x:.1f},{y:.1f}" for x, y in pts)
            extra = "".join(f' {_e(k)}="{_e(v)}"' for k, v in (m.attrs[0] if m.attrs else {}).items())
            out.append(f'<path d="{d}" fill="none" stroke="{_e(m.color)}" stroke-width="2" '
                       f'{DASH if m.dash else ""}opacity="0.85" pointer-events="none"'
                       f' class="{m.kind}"{extra}/>')
            return out
        if m.kind == "bar":
            for x, lo, hi in zip(m.xs, m.lows, m.highs, strict=True):
                if not (math.isfinite(lo) and math.isfinite(hi) and self.x.inside(x)):
                    continue
                if self.log_y and (lo <= 0 or hi <= 0):
                    continue
                px, plo, phi = sx(x), sy(lo), sy(hi)
                out.append(f'<path d="M{px:.1f},{plo:.1f}V{phi:.1f}M{px - 4:.1f},{plo:.1f}'
                           f'H{px + 4:.1f}M{px - 4:.1f},{phi:.1f}H{px + 4:.1f}" '
                           f'stroke="{_e(m.color)}" stroke-width="1.3" class="interval" '
                           'pointer-events="none"/>')
            return out
        ys = m.ys if m.kind == "point" else [math.nan] * len(m.xs)
        for i, (x, y) in enumerate(zip(m.xs, ys, strict=True)):
            if not (self.x.keeps(x) and self.x.inside(x)):
                continue
            px = sx(x)
            if m.kind == "floor":
                py = floor_y - 8
            elif not math.isfinite(y) or (self.log_y and y <= 0):
                continue
            else:
                py = sy(y)
            attrs = "".join(f' {_e(k)}="{_e(v)}"' for k, v in (m.attrs[i] if i < len(m.attrs) else {}).items())
            title = f"<title>{_e(m.titles[i])}</title>" if i < len(m.titles) else ""
            fill = "none" if m.hollow else _e(m.color)
            s = m.size
            if m.shape == "diamond":
                shape = (f'<path d="M{px:.1f},{py - s:.1f}L{px + s:.1f},{py:.1f}L{px:.1f},'
                         f'{py + s:.1f}L{px - s:.1f},{py:.1f}Z" fill="{fill}" '
                         f'stroke="{_e(m.color)}" stroke-width="1.2"')
            elif m.shape == "cross":
                shape = (f'<path d="M{px - s:.1f},{py - s:.1f}L{px + s:.1f},{py + s:.1f}'
                         f'M{px - s:.1f},{py + s:.1f}L{px + s:.1f},{py - s:.1f}" '
                         f'stroke="{_e(m.color)}" stroke-width="2"')
            else:
                shape = (f'<circle cx="{px:.1f}" cy="{py:.1f}" r="{s}" fill="{fill}" '
                         f'stroke="{"#fff" if not m.hollow else _e(m.color)}" stroke-width="1"')
            mark = f'<g class="mark"{attrs}>{shape}/>{title}</g>'
            if i < len(m.links) and m.links[i]:
                mark = f'<a href="{_e(m.links[i])}">{mark}</a>'
            out.append(mark)
        return out

    def _legend_layout(self, left: float) -> tuple[str, int]:
        """The legend's items laid out left to right in rows above the plot."""
        items = [m for m in self.marks if m.label]
        out, x, row = [], float(left), 0
        for m in items:
            width = 30 + 6.2 * len(m.label)
            if x + width > self.width - 10 and x > left:
                x, row = float(left), row + 1
            yy = 12 + row * 16
            if m.kind in ("step", "line"):
                sym = (f'<line x1="{x:.0f}" x2="{x + 16:.0f}" y1="{yy}" y2="{yy}" '
                       f'stroke="{_e(m.color)}" stroke-width="2"'
                       f'{" " + DASH if m.dash else ""}/>')
            elif m.shape == "cross" or m.kind == "floor":
                sym = (f'<path d="M{x + 4:.0f},{yy - 4}L{x + 12:.0f},{yy + 4}M{x + 4:.0f},'
                       f'{yy + 4}L{x + 12:.0f},{yy - 4}" stroke="{_e(m.color)}" stroke-width="2"/>')
            else:
                fill = "none" if m.hollow else _e(m.color)
                sym = (f'<circle cx="{x + 8:.0f}" cy="{yy}" r="4" fill="{fill}" '
                       f'stroke="{_e(m.color)}"/>')
            out.append(f'{sym}<text x="{x + 22:.0f}" y="{yy + 4}" class="legend">'
                       f"{_e(m.label)}</text>")
            x += width
        return "".join(out), (row + 1 if items else 0)
