"""The dashboard you can click through, on a real tuned study with every kind of knob (a
log-scale float, a boolean, words, numbers), keeps and their confirmation pairs, served by
the real CLI and used in a real headless Chromium with the mouse:

- a click on a point (metric chart, knob slice, parallel coordinates, slot timeline)
  opens its candidate, live and in the static report;
- the metric chart's x axis ticks at whole candidates; its log scale and its zoom (typed,
  and dragged) redraw it as asked;
- each knob on its own scale (log on a log axis, booleans and words as categories);
- two candidates side by side, reached from a candidate's page and from the pickers;
- the slots over time and candidates finished per hour, against the ledger;
- the pages keep their CSP: only the server's own script runs, and nothing breaks it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import textwrap
import time
from pathlib import Path

import pytest
from helpers import config_text, make_repo, ratchet

from ratchet.store.ledger import Ledger
from ratchet.ui import blocks, serve, slots, svg
from web.browser import Browser, BrowserError, needs_chromium
from web.test_serve import at, base_of, bearer, fetch, serving, shots_dir

SOLUTION = '''
"""Editable."""

X = 3.0  # numbers, as choices
LR = 0.1  # a log-scale float
FAST = True  # a boolean
MODE = "c"  # words


def score():
    import math
    return ((X - 1.25) ** 2 + 0.1 * abs(math.log10(LR) + 2.5) + (0.05 if FAST else 0.0)
            + {"a": 0.0, "b": 0.02, "c": 0.04}[MODE])
'''

EVALUATOR = '''
import time
import solution
time.sleep(0.3)
print("correct: true")
print(f"score: {solution.score():.6f}")
'''

KNOBS = textwrap.dedent('''
    [tune.knobs]
    "solution.py:X" = { choices = [3.0, 2.0, 1.5, 1.0] }
    "solution.py:LR" = { low = 0.0001, high = 0.1, log = true }
    "solution.py:FAST" = { choices = [true, false] }
    "solution.py:MODE" = { choices = ["c", "b", "a"] }
''')


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    repo = make_repo(tmp_path_factory.mktemp("dashboard") / "repo", {
        "ratchet.toml": config_text(
            knobs=KNOBS,
            search='[search]\nproposer = "tune"\nparallel = 3\nrounds = 6\n',
            backend='[backend]\nkind = "local"\nslots = 3\n'),
        "evaluate.py": EVALUATOR, "solution.py": SOLUTION})
    ratchet(repo, "run", check=True)
    ratchet(repo, "report", check=True)
    return repo


def rows(repo: Path) -> list:
    ledger = Ledger.readonly(repo / ".ratchet" / "ledger.db")
    try:
        return ledger.candidates(confirmations=True)
    finally:
        ledger.close()


def incumbent_id(repo: Path) -> str:
    ledger = Ledger.readonly(repo / ".ratchet" / "ledger.db")
    try:
        return str(ledger.get("incumbent_id"))
    finally:
        ledger.close()


def svg_of(title: str) -> str:
    """JS: the chart whose title is `title`."""
    return (f"Array.from(document.querySelectorAll('svg.chart')).find(s => "
            f"s.querySelector('title').textContent === {title!r})")


# where on the mark a click lands on it and not on a mark drawn over it: a dot's or a
# bar's middle, or the first place along a line that is its own
WHERE = """(() => {
  const el = document.querySelector(%s);
  el.scrollIntoView({block: 'center'});
  const link = el.closest('a'), m = el.getScreenCTM(), pts = [];
  if (el.tagName === 'path') {
    const n = el.getTotalLength();
    for (let i = 1; i < 60; i++) pts.push(el.getPointAtLength(n * i / 60));
  } else {
    const b = el.getBBox();
    pts.push({x: b.x + b.width / 2, y: b.y + b.height / 2});
  }
  for (const p of pts) {
    const x = m.a * p.x + m.c * p.y + m.e, y = m.b * p.x + m.d * p.y + m.f;
    const hit = document.elementFromPoint(x, y);
    if (hit && hit.closest('a') === link) return [x, y];
  }
  return null;
})()"""


def opens(browser: Browser, selector: str, path: str) -> None:
    """Click `selector` with the mouse; the page at `path` opens."""
    if selector.startswith(("#", "a")):
        browser.click(selector)
    else:
        spot = browser.eval(WHERE % json.dumps(selector))
        assert spot, f"{selector}: covered everywhere by other marks"
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            browser.mouse(kind, *spot)
    arrived(browser, f"location.pathname.endsWith({path!r})")


def arrived(browser: Browser, expression: str, timeout: float = 30) -> None:
    """Wait for a page a click opened: asked while it navigates, the browser says the
    page is gone; asked again, the new one answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if browser.eval(f"({expression}) && document.readyState === 'complete'"):
                return
        except BrowserError:
            pass
        assert time.monotonic() < deadline, f"{expression}: not reached in {timeout} s"
        time.sleep(0.1)


def affine(xs: list[float], ys: list[float]) -> bool:
    """ys = a·xs + b, to the drawing's rounding (0.1 px)."""
    (x0, y0), (x1, y1) = min(zip(xs, ys, strict=True)), max(zip(xs, ys, strict=True))
    if x1 == x0:
        return all(abs(y - y0) < 0.2 for y in ys)
    slope = (y1 - y0) / (x1 - x0)
    return all(abs(y0 + slope * (x - x0) - y) < 0.25 for x, y in zip(xs, ys, strict=True))


# ---------------------------------------------------------------------------------------


@needs_chromium
def test_every_point_opens_its_candidate_live_and_in_the_report(study, tmp_path):
    cands = rows(study)
    ids = {c.id for c in cands}
    report = study / ".ratchet" / "report" / "index.html"
    with serving(study) as url, Browser(tmp_path / "profile") as browser:
        browser.goto(url)
        # every mark of every chart but the throughput's bins is a link to its own page
        marks = browser.eval(
            "Array.from(document.querySelectorAll('svg.chart g.mark, svg.chart path.pc-line,"
            " svg.chart rect.job')).filter(m => !m.closest('#throughput')).map(m => {"
            " const a = m.closest('a'); return [m.dataset.id || null, a && a.getAttribute('href')];})")
        assert len(marks) > 20
        assert all(href == f"/c/{cid}" and cid in ids for cid, href in marks), marks
        # a click with the mouse on the best kept point opens that candidate's page
        keep = next(c for c in cands if c.status == "keep" and c.kind == "candidate")
        opens(browser, f"svg.chart g.mark[data-id='{keep.id}'][data-metric] circle", f"/c/{keep.id}")
        assert browser.eval("document.querySelector('h1').textContent").startswith(keep.id)
        # a knob's slice, a line of the parallel coordinates, a bar of the slot timeline
        trial = next(c for c in cands if c.kind == "candidate" and c.status == "discard")
        for selector in (f"g.mark[data-knob='solution.py:LR'][data-id='{trial.id}'] circle",
                         f"path.pc-line[data-id='{trial.id}']",
                         f"rect.job[data-id='{trial.id}']"):
            browser.goto(url)
            opens(browser, selector, f"/c/{trial.id}")
        pair = next(c for c in cands if c.kind == "confirm")
        browser.goto(url)
        opens(browser, f"rect.job[data-id='{pair.id}']", f"/c/{pair.id}")
        assert browser.eval(f"document.querySelector('table.kv a[href=\"/c/{pair.confirms}\"]')"
                            " !== null")
        assert not [m for m in browser.console if "Content Security Policy" in m]

    # the static report: the same links, files on disk, no script at all
    with Browser(tmp_path / "profile-report") as browser:
        browser.goto(report.as_uri())
        assert browser.eval("document.scripts.length") == 0
        shown = browser.eval("document.querySelector('.linear-chart').offsetParent !== null"
                             " ? 'linear-chart' : 'log-chart'")  # the scale the switch shows
        opens(browser, f".{shown} svg.chart g.mark[data-id='{keep.id}'][data-metric] circle",
              f"/c/{keep.id}.html")
        assert browser.eval("document.querySelector('h1').textContent").startswith(keep.id)


@needs_chromium
def test_metric_chart_ticks_whole_candidates_and_has_a_log_scale_and_zoom(study, tmp_path):
    cands = [c for c in rows(study) if c.kind != "confirm"]
    seq = {c.id: c.seq for c in cands}
    points = ("Array.from(document.querySelectorAll('#metric-zoom g.mark[data-metric]')).map(m =>"
              " [m.dataset.id, Number(m.dataset.metric), Number(m.querySelector('circle')"
              ".getAttribute('cy'))])")
    ticks = "Array.from(document.querySelectorAll('#metric-zoom text.xtick')).map(t => t.textContent)"
    with serving(study) as url, Browser(tmp_path / "profile") as browser:
        browser.goto(url)
        overview_ticks = browser.eval(
            f"Array.from({svg_of('score over candidates')}.querySelectorAll('text.xtick'))"
            ".map(t => t.textContent)")
        assert overview_ticks and all(re.fullmatch(r"-?\d+", t) for t in overview_ticks), overview_ticks
        opens(browser, "#open-metric", "/metric")
        assert all(re.fullmatch(r"-?\d+", t) for t in browser.eval(ticks))
        whole = browser.eval(points)
        assert {p[0] for p in whole} == {c.id for c in cands if c.metric is not None}
        # linear: the height of a point is affine in its metric; log: in the metric's log.
        # The page starts on the scale the data asks for (log past a 20x span), then each
        # link switches it
        values = [m for _, m, _ in whole]
        first = browser.eval("document.getElementById('metric-zoom').dataset.log") == "1"
        assert first == (max(values) / min(values) > 20)
        for log in (first, not first, first):
            if log != (browser.eval("document.getElementById('metric-zoom').dataset.log") == "1"):
                opens(browser, "#scale-log" if log else "#scale-linear", "/metric")
                assert f"log={int(log)}" in browser.eval("location.search")
            shown = browser.eval(points)
            heights = [y for _, _, y in shown]
            assert affine([math.log10(m) if log else m for _, m, _ in shown], heights), log
            assert not affine([m if log else math.log10(m) for _, m, _ in shown], heights), log

        # zoom by a range typed in
        browser.eval("document.getElementById('zoom-from').value = '2';"
                     "document.getElementById('zoom-to').value = '5'")
        browser.click("#zoom-apply")
        arrived(browser, "location.search.includes('from=2') && location.search.includes('to=5')")
        browser.wait_for("document.querySelector('#metric-zoom svg') !== null")
        shown = {p[0] for p in browser.eval(points)}
        assert shown == {c.id for c in cands if c.metric is not None and 2 <= c.seq <= 5}
        assert all(re.fullmatch(r"\d+", t) and 1 <= int(t) <= 6 for t in browser.eval(ticks))

        # zoom by a drag across the chart, from the 3rd candidate's point to the 6th's
        opens(browser, "#zoom-reset", "/metric")
        assert "from=" not in browser.eval("location.search")
        by_seq = {seq[p[0]]: p[0] for p in browser.eval(points)}
        lo, hi = sorted(by_seq)[2], sorted(by_seq)[5]
        start = browser.center(f"#metric-zoom g.mark[data-id='{by_seq[lo]}'] circle")
        end = browser.center(f"#metric-zoom g.mark[data-id='{by_seq[hi]}'] circle")
        browser.drag((start[0] - 3, start[1] + 40), (end[0] + 3, end[1] - 40))
        arrived(browser, "location.search.includes('from=')")
        query = dict(re.findall(r"(from|to)=([^&]+)", browser.eval("location.search")))
        assert (int(query["from"]), int(query["to"])) == (lo, hi)
        browser.wait_for("document.querySelector('#metric-zoom svg') !== null")
        assert {seq[p[0]] for p in browser.eval(points)} == {
            c.seq for c in cands if c.metric is not None and lo <= c.seq <= hi}
        browser.screenshot(shots_dir(tmp_path) / "metric-zoom.png")
        # on the zoomable chart too, a click on a point opens its candidate, even one whose
        # hand moved a pixel or two (a drag of under 6 px is a click)
        x, y = browser.center(f"#metric-zoom g.mark[data-id='{by_seq[hi]}'] circle")
        browser.drag((x - 1, y), (x + 1, y), steps=2)
        arrived(browser, f"location.pathname.endsWith('/c/{by_seq[hi]}')")
        assert not [m for m in browser.console if "Content Security Policy" in m]


@needs_chromium
def test_each_knob_on_its_own_scale_in_slices_and_parallel_coordinates(study, tmp_path):
    trials = [c for c in rows(study) if c.kind == "candidate" and c.status in ("keep", "discard")
              and c.metric is not None]
    assert len(trials) >= 5
    assert {c.params["solution.py:FAST"] for c in trials} <= {True, False}
    with serving(study) as url, Browser(tmp_path / "profile") as browser:
        browser.goto(url)

        def xticks(knob: str) -> list[str]:
            return browser.eval(f"Array.from({svg_of(f'score against {knob}')}"
                                ".querySelectorAll('text.xtick')).map(t => t.textContent)")

        def slice_points(knob: str) -> list[list]:
            return browser.eval(f"Array.from({svg_of(f'score against {knob}')}.querySelectorAll("
                                "'g.mark')).map(m => [m.dataset.id, m.dataset.value, "
                                "Number(m.querySelector('circle').getAttribute('cx'))])")

        # categories: the choices, numbers in their order, booleans and words as written
        assert xticks("solution.py:X") == ["1", "1.5", "2", "3"]
        assert xticks("solution.py:FAST") == ["true", "false"]
        assert xticks("solution.py:MODE") == ["c", "b", "a"]
        # the log knob: its whole range, ticks at 1, 2, 5 x powers of ten, and a point's
        # place is affine in the log of its value
        lr = slice_points("solution.py:LR")
        assert {p[0] for p in lr} == {c.id for c in trials}
        values = {c.id: c.params["solution.py:LR"] for c in trials}
        assert affine([math.log10(values[i]) for i, _, _ in lr], [x for _, _, x in lr])
        assert {"0.0001", "0.001", "0.01", "0.1"} <= set(xticks("solution.py:LR"))
        # every trial's boolean is drawn, at its own category
        fast = slice_points("solution.py:FAST")
        assert {p[0] for p in fast} == {c.id for c in trials}
        assert all(v == str(c.params["solution.py:FAST"]).lower()
                   for (i, v, _), c in ((p, next(t for t in trials if t.id == p[0])) for p in fast))
        # parallel coordinates: an axis per knob on its own scale, then the metric's (log
        # where it spans more than 20x, as the metric chart)
        axes = browser.eval("Array.from(document.querySelectorAll('svg.parallel g.pc-axis'))"
                            ".map(a => [a.dataset.knob, a.dataset.scale])")
        metrics = [c.metric for c in trials]
        assert axes == [["solution.py:X", "categories"], ["solution.py:LR", "log"],
                        ["solution.py:FAST", "categories"], ["solution.py:MODE", "categories"],
                        ["score", "log" if max(metrics) / min(metrics) > 20 else "linear"]]
        lines = browser.eval("Array.from(document.querySelectorAll('svg.parallel path.pc-line'))"
                             ".map(p => p.dataset.id)")
        assert sorted(lines) == sorted(c.id for c in trials)
        browser.eval("document.querySelector('svg.parallel').scrollIntoView()")
        browser.screenshot(shots_dir(tmp_path) / "knobs.png", full_page=False)


@needs_chromium
def test_two_candidates_side_by_side(study, tmp_path):
    cands = rows(study)
    inc = incumbent_id(study)
    other = next(c for c in cands if c.kind == "candidate" and c.status == "discard"
                 and c.phases)
    by_id = {c.id: c for c in cands}
    with serving(study) as url, Browser(tmp_path / "profile") as browser:
        browser.goto(url)
        assert browser.eval("Array.from(document.querySelectorAll('nav a'))"
                            ".some(a => a.getAttribute('href') === '/compare')")
        browser.goto(at(url, f"c/{other.id}"))
        opens(browser, "#compare-with a", "/compare")
        assert browser.eval("location.search") == f"?a={inc}&b={other.id}"
        table = browser.eval("Object.fromEntries(Array.from(document.querySelectorAll("
                             "'#compare-numbers tbody tr')).map(r => [r.cells[0].textContent,"
                             " Array.from(r.cells).slice(1).map(c => c.textContent)]))")
        a, b = by_id[inc], other
        assert table["candidate"][:2] == [a.id, b.id]
        assert [float(v) for v in table["score"][:2]] == pytest.approx([a.metric, b.metric], rel=1e-5)
        assert float(table["score"][2].split()[0]) == pytest.approx(b.metric - a.metric, abs=1e-5)
        for knob in ("solution.py:X", "solution.py:LR", "solution.py:FAST", "solution.py:MODE"):
            differs = a.params.get(knob) != b.params.get(knob) if a.params else True
            assert (table[f"knob {knob}"][2] == "differs") == differs
        phases = browser.eval("Array.from(document.querySelectorAll('#compare-phases tbody tr'))"
                              ".map(r => r.cells[0].textContent)")
        assert phases == [p["name"] for p in b.phases]
        diff = browser.eval("document.querySelector('pre.diff').textContent")
        assert "solution.py" in diff and re.search(r"^\+\w+ = ", diff, re.M)
        browser.screenshot(shots_dir(tmp_path) / "compare.png")

        # the pickers: choose another B, and that pair opens
        third = next(c for c in cands if c.kind == "candidate" and c.id not in (a.id, b.id))
        browser.eval(f"const s = document.getElementById('compare-b'); s.value = {third.id!r};"
                     " s.dispatchEvent(new Event('change'))")
        arrived(browser, f"location.search === '?a={inc}&b={third.id}'")
        browser.wait_for(f"document.querySelector('h1').textContent.includes({third.id!r})")
        assert not [m for m in browser.console if "Content Security Policy" in m]
    # a candidate no study has: one line, escaped, never a page of it
    with serving(study) as url:
        code, _h, body = fetch(base_of(url) + "compare?a=%3Cscript%3E&b=c0001", bearer(url))
        assert code == 404 and "<script>" not in body


@needs_chromium
def test_slot_timeline_and_throughput_agree_with_the_ledger(study, tmp_path):
    cands = rows(study)
    ran = [c for c in cands if c.finished_at is not None and c.submitted_at is not None]
    with serving(study) as url, Browser(tmp_path / "profile") as browser:
        browser.goto(url)
        bars = browser.eval("Array.from(document.querySelectorAll('svg.timeline rect.job')).map("
                            "r => [r.dataset.id, r.dataset.slot, r.dataset.kind,"
                            " Number(r.dataset.start), Number(r.dataset.end)])")
        assert {b[0] for b in bars} == {c.id for c in ran}
        by_id = {c.id: c for c in ran}
        for cid, slot, kind, _s, _e in bars:  # the slot the backend recorded, the kind
            assert slot == by_id[cid].slot
            assert kind == ("confirming" if by_id[cid].kind == "confirm" else
                            "candidate" if by_id[cid].kind == "candidate" else "baseline")
        assert "confirming" in {b[2] for b in bars}
        lanes = browser.eval("Array.from(document.querySelectorAll('svg.timeline g.lane'))"
                             ".map(g => [g.dataset.slot, Number(g.dataset.idle)])")
        assert sorted(s for s, _ in lanes) == sorted({c.slot for c in ran})
        t0 = min(c.submitted_at + (c.queue_s or 0) for c in ran)
        span = max(c.finished_at for c in ran) - t0
        for slot, idle in lanes:  # a slot runs one job at a time: idle = 1 - its jobs' time
            mine = sorted((s, e) for _i, sl, _k, s, e in bars if sl == slot)
            assert all(a[1] <= b[0] + 0.01 for a, b in zip(mine, mine[1:], strict=False))
            assert idle == pytest.approx(1 - sum(e - s for s, e in mine) / span, abs=0.002)

        # candidates finished per hour: the bins count every candidate that finished
        width = float(browser.eval("document.getElementById('throughput').dataset.binSeconds"))
        bins = browser.eval("Array.from(document.querySelectorAll('#throughput g.mark')).map(m =>"
                            " [Number(m.dataset.count), Number(m.dataset.rate)])")
        finished = [c for c in cands if c.kind == "candidate" and c.finished_at is not None]
        assert sum(n for n, _ in bins) == len(finished)
        assert all(r == pytest.approx(n * 3600 / width, rel=1e-5) for n, r in bins)
        # its mean is the costs table's "candidates judged per hour", written alike
        text = browser.eval("document.body.innerText")
        costs = re.search(r"candidates judged per hour\s+([\d.]+)", text)
        mean = re.search(r"mean ([\d.]+) per hour while the study ran", text)
        assert costs and mean and costs.group(1) == mean.group(1), (costs, mean)
        browser.eval("document.querySelector('svg.timeline').scrollIntoView()")
        browser.screenshot(shots_dir(tmp_path) / "timeline.png", full_page=False)


def test_jobs_with_no_slot_are_packed_into_lanes_and_said_so(study):
    """A backend that records no slot: each job goes to the first lane free at its start,
    so no lane runs two at once and there are as many lanes as jobs ever overlapped."""
    cands = [dataclasses.replace(c, slot=None) for c in rows(study)]
    jobs, packed = slots.jobs_of(cands, time.time())
    assert packed and jobs
    by_lane: dict[str, list[tuple[float, float]]] = {}
    for j in jobs:
        by_lane.setdefault(j.lane, []).append((j.start, j.end))
    for spans in by_lane.values():
        spans.sort()
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False))
    events = sorted([(j.start, 1) for j in jobs] + [(j.end, -1) for j in jobs],
                    key=lambda e: (e[0], e[1]))
    most = now = 0
    for _t, step in events:
        now += step
        most = max(most, now)
    assert len(by_lane) == most
    # and the page draws those lanes and says why
    study_ro = serve.ReadOnlyStudy(study)
    try:
        html = slots.slot_timeline(blocks.snapshot(study_ro, cands), blocks.LIVE)
    finally:
        study_ro.close()
    assert 'id="timeline-packed"' in html
    assert sorted(set(re.findall(r'<g class="lane" data-slot="([^"]+)"', html))) == sorted(by_lane)


def test_the_new_pages_keep_the_csp_and_refuse_writes(study):
    with serving(study) as url:
        for page in ("metric", "compare", "metric?log=1&from=2&to=4", "metric?from=x&to=%3C"):
            code, headers, body = fetch(base_of(url) + page, bearer(url))
            assert code == 200, (page, body[:300])
            nonce = re.search(r"'nonce-([^']+)'", headers["Content-Security-Policy"]).group(1)
            assert headers["Content-Security-Policy"] == serve.csp(nonce) + "; frame-ancestors 'none'"
            assert body.count("<script") == 1 and "<script>" not in body.replace(
                f'<script nonce="{nonce}">', "")
        code, _h, _b = fetch(base_of(url) + "compare", bearer(url), method="POST")
        assert code == 405


def test_log_axes_tick_at_round_values():
    """A log axis labels 1, 2, 5 x powers of ten (or round values inside one decade),
    never 10^0.4 = 0.2512; a candidate axis labels whole candidates only."""
    assert svg.log_ticks(math.log10(0.15), math.log10(0.27)) == pytest.approx([0.15, 0.2, 0.25])
    assert svg.log_ticks(-4, -1) == pytest.approx(
        [m * 10.0 ** k for k in (-4, -3, -2) for m in (1, 2, 5)] + [0.1])
    assert svg.log_ticks(-6, 1) == pytest.approx([10.0 ** k for k in range(-6, 2)])
    assert svg.nice_ticks(-0.06, 2.06, 8, integer=True) == [0, 1, 2]


@needs_chromium
def test_the_static_report_switches_to_a_log_scale_without_script(study, tmp_path):
    """The report runs no script: its log-scale switch is a checkbox and CSS."""
    report = study / ".ratchet" / "report" / "index.html"
    assert ratchet(study, "report").returncode == 0
    shown = ("Array.from(document.querySelectorAll('.linear-chart, .log-chart'))"
             ".filter(d => d.offsetParent !== null).map(d => d.className)")
    heights = ("Array.from(document.querySelectorAll('.{} g.mark[data-metric]')).map(m =>"
               " [Number(m.dataset.metric), Number(m.querySelector('circle').getAttribute('cy'))])")
    with Browser(tmp_path / "profile") as browser:
        browser.goto(report.as_uri())
        assert browser.eval("document.scripts.length") == 0
        first = browser.eval(shown)
        assert len(first) == 1
        for _ in range(2):
            before = browser.eval(shown)
            browser.click("#log-switch-label")
            now = browser.eval(shown)
            assert len(now) == 1 and now != before
            points = browser.eval(heights.format(now[0]))
            log = now[0] == "log-chart"
            assert affine([math.log10(m) if log else m for m, _ in points], [y for _, y in points])
        assert browser.eval(shown) == first
        # a point of the chart shown still opens its candidate
        cid = browser.eval(f"document.querySelector('.{first[0]} g.mark[data-metric]').dataset.id")
        opens(browser, f".{first[0]} g.mark[data-id='{cid}'][data-metric] circle", f"/c/{cid}.html")
