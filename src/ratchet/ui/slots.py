"""What the slots did over time and how fast candidates finished: a timeline of which
job ran in which slot (candidates, confirmation pairs, the baseline and re-measures,
running jobs; the gaps idle), and candidates finished per hour over time.

Read from the ledger alone: a job ran from when a slot took it (submitted plus its queue
time) to when it finished, in the slot its backend recorded; where none was recorded,
lanes are made by packing the intervals (and the page says so). Inline SVG (`svg.py`);
each job bar is an SVG `<a>` to its candidate.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from ratchet.core.candidate import Candidate
from ratchet.core.vocab import Kind, Status
from ratchet.ui.svg import Chart, _e, fmt, nice_ticks

if TYPE_CHECKING:
    from ratchet.ui.blocks import Site, Snapshot

JOB_COLORS = {"candidate": "#1565c0", "confirming": "#8e24aa", "baseline": "#00897b",
              "running": "#ffb300"}



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
    return _one_at_a_time(jobs), packed


def _one_at_a_time(jobs: list[Job]) -> list[Job]:
    """A slot runs one job at a time, but a job's end is when the driver recorded its
    result, which lags the worker's end by a poll (seconds on a loaded machine), while the
    next job's start is the worker's own: a bar ends where its slot's next job began."""
    next_start: dict[int, float] = {}
    by_lane: dict[str, list[int]] = {}
    for i, job in enumerate(jobs):
        by_lane.setdefault(job.lane, []).append(i)
    for indices in by_lane.values():
        indices.sort(key=lambda i: jobs[i].start)
        for i, j in zip(indices, indices[1:], strict=False):
            next_start[i] = jobs[j].start
    return [replace(job, end=max(job.start, min(job.end, next_start[i])))
            if i in next_start else job for i, job in enumerate(jobs)]


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
TIMELINE_JOBS = 250  # the most job bars drawn (the latest): the SVG stays small


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
            # short: a study draws hundreds (the description is a click away)
            what = f", confirms {c.confirms}" if c.confirms else ""
            out.append(f'<a href="{_e(site.candidate(c.id))}"><rect class="job" '
                       f'data-id="{_e(c.id)}" data-kind="{j.kind}" data-slot="{_e(lane)}" '
                       f'data-start="{j.start - t0:.3f}" data-end="{j.end - t0:.3f}" '
                       f'x="{sx(j.start):.1f}" y="{y + 4}" width="{w:.1f}" height="{TL_LANE - 8}" '
                       f'fill="{JOB_COLORS[j.kind]}"><title>{_e(c.id)} {_e(c.status)}{_e(what)}: '
                       f"{j.start - t0:.1f}–{j.end - t0:.1f} s</title></rect></a>")
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


def throughput_chart(snap: Snapshot, per_hour: float | None = None) -> str:
    """Candidates finished per hour, in bins of time since the first job started; the
    dashed mean is `per_hour` (the costs table's: judged per hour of wall time, the idle
    gaps between sessions left out) where given, else the bins' own."""
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
    if per_hour is not None:  # written as the costs table writes it: one number, one form
        mean, label = per_hour, f"mean {per_hour:.1f} per hour while the study ran (costs)"
    else:
        mean = len(cands) / max(hours * len(counts), 1e-9)
        label = f"mean {mean:.4g} per hour"
    chart.line([0, len(counts) * width / per], [mean, mean], "#9e9e9e", dash=True, label=label)
    return (f'<h2>Throughput over time</h2><div id="throughput" data-bin-seconds="{width:g}">'
            f"{chart.render()}</div>")
