"""The views at scale read SQL aggregates (issue 38): the same counts, estimates and spend
as the Python walks over every row they replace, on a real study of about 500 rows."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
from helpers import ROOT, ratchet

from ratchet.core import stats
from ratchet.core.vocab import Kind, Status
from ratchet.driver import spend, views
from ratchet.driver.judge import Confirmation, reported_noise
from ratchet.job.jobspec import JobResult
from ratchet.store.ledger import Ledger, slot_seconds, study_wall, throughput

sys.path.insert(0, str(ROOT / "bench"))
import views as bench  # noqa: E402  (bench/views.py: the study and its growth)

ROWS = 500


@pytest.fixture(scope="module")
def ledger(tmp_path_factory):
    repo = tmp_path_factory.mktemp("scale") / "study"
    bench.real_study(repo)
    bench.grow(repo, ROWS)
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    yield ledger
    ledger.close()


def walked_evaluations(ledger: Ledger) -> dict[str, list[float]]:
    """Ledger.evaluations as it was: a walk over every decoded row."""
    out: dict[str, list[float]] = {}
    rows = sorted(ledger.candidates(confirmations=True),
                  key=lambda c: (c.kind == Kind.CONFIRM, -c.seq if c.kind == Kind.CONFIRM
                                 else c.seq))
    for cand in rows:
        if (cand.metric is None or not cand.commit_sha
                or cand.status not in (Status.KEEP, Status.DISCARD, Status.REFERENCE)
                or (cand.extra or {}).get("stopped_early")):
            continue
        out.setdefault(cand.commit_sha, []).append(cand.metric)
    return out


def test_the_ledger_holds_the_rows(ledger):
    assert ledger.count(confirmations=True) >= ROWS
    assert ledger.revision() >= ROWS  # every row numbered by the triggers


def test_counts_and_estimates_agree_with_the_walk(ledger):
    cands = ledger.candidates()
    walked: dict[str, int] = {}
    for c in cands:
        walked[c.status] = walked.get(c.status, 0) + 1
    assert ledger.status_counts(confirmations=False) == walked
    assert ledger.count(Kind.CANDIDATE, judged=True) == sum(
        1 for c in cands if c.kind == Kind.CANDIDATE and c.is_judged)
    assert ledger.rounds_done() == views.rounds_done(ledger.get("round"), cands)
    groups = walked_evaluations(ledger)
    assert ledger.evaluations() == groups
    reported = []
    for c in ledger.candidates(confirmations=True):
        if c.result and c.metric is not None and c.status in (
                Status.KEEP, Status.DISCARD, Status.REFERENCE):
            sem = reported_noise(JobResult.from_json(__import__("json").dumps(c.result)),
                                 "score")
            if sem is not None:
                reported.append((sem, c.metric))
    assert views.reported_errors(ledger, "score") == reported
    noise = Confirmation(measure=lambda *_: [], groups=groups, reported=reported).noise()
    head = views.headline(ledger, "score", "minimize")
    assert head.noise == noise
    assert head.baseline == stats.estimate(groups[ledger.get("pinned")], noise)
    assert head.incumbent == stats.estimate(groups[ledger.get("incumbent")], noise)


def test_spend_and_throughput_agree_with_the_walk(ledger):
    rows = ledger.candidates(confirmations=True)
    summary = spend.summary(ledger)
    held = [slot_seconds(c) + (c.extra_slot_s or 0.0) for c in rows]
    assert summary.jobs == sum(1 for c, h in zip(rows, held, strict=True)
                               if (h > 0 or c.cost_usd is not None) and (c.job_id or h > 0))
    assert math.isclose(summary.slot_hours, sum(held) / 3600, rel_tol=1e-9)
    assert math.isclose(summary.wall_hours, study_wall(rows, ledger.sessions()) / 3600,
                        rel_tol=1e-9)
    by_row = spend.per_candidate(ledger)
    assert set(by_row) == {c.id for c in rows if c.kind != Kind.CONFIRM}
    walked: dict[str, float] = {}  # its own jobs and its confirmation pairs'
    for c, h in zip(rows, held, strict=True):
        owner = c.confirms if c.kind == Kind.CONFIRM else c.id
        walked[owner or ""] = walked.get(owner or "", 0.0) + h
    for cand_id, row in by_row.items():
        assert math.isclose(row.slot_s, walked[cand_id], rel_tol=1e-9, abs_tol=1e-12)
    assert spend.per_candidate(ledger, [rows[-1].id]) == {rows[-1].id: by_row[rows[-1].id]}
    walked = throughput(rows, 2, ledger.sessions())
    fast = ledger.throughput(2)
    assert (fast.jobs, fast.duty, fast.limit_per_hour, fast.per_hour) == \
        (walked.jobs, walked.duty, walked.limit_per_hour, walked.per_hour)


def test_pages_and_last_rows_are_the_walks_slices(ledger):
    cands = ledger.candidates()
    assert [c.id for c in ledger.last(50)] == [c.id for c in cands[-50:]]
    discards = [c.id for c in cands if c.status == Status.DISCARD]
    rows, total = ledger.page(10, 20, status=Status.DISCARD)
    assert total == len(discards) and [c.id for c in rows] == discards[10:30]
    rows, _ = ledger.page(0, 5, order="metric")
    measured = sorted((c for c in cands if c.metric is not None),
                      key=lambda c: (c.metric, c.seq))
    assert [c.id for c in rows] == [c.id for c in measured[:5]]


def test_rows_since_a_revision_are_the_rows_written_since(ledger):
    before = ledger.revision()
    cand = ledger.candidates()[-1]
    ledger.update(cand.id, reasons="seen again")
    changed = ledger.rows_since(before)
    assert [c.id for c in changed] == [cand.id] and changed[0].reasons == "seen again"
    assert len(ledger.rows_since(None)) == ledger.count(confirmations=True)


def test_the_dashboard_draws_a_bounded_chart_and_pages_the_table(ledger, monkeypatch):
    from ratchet.ui import blocks, pages, serve

    monkeypatch.setattr(blocks, "CHART_POINTS", 100)  # 500 rows: a study past the bound
    repo = Path(ledger.path).parents[1]
    study = serve.ReadOnlyStudy(repo)
    try:
        app = serve.Dashboard(study, "x" * 24, "127.0.0.1", True)
        overview, _, _, _ = app.render(serve.overview_view(), True)
        assert overview.count('data-metric="') <= blocks.CHART_POINTS + 50
        assert "points drawn" in overview
        table, _, _, _ = app.render(serve.candidates_view(serve.TableQuery(page=2)), True)
        assert table.count("<tr") <= pages.PAGE_ROWS + 1
        assert "rows 201–400 of" in table
    finally:
        study.close()


def test_a_phase_that_moves_while_a_page_is_made_is_shown_next(ledger):
    """The dashboard's version of a page is read before the page is made: a job that
    moves from one phase to the next meanwhile leaves the page older than the study, so
    the event stream's next version differs and the page fetches again. (Read after,
    the version named the new phase the page never showed, and an open page skipped a
    job's `evaluate` phase: the flaky test_the_open_page_follows_a_running_study.)"""
    import json

    from ratchet.ui import serve

    repo = Path(ledger.path).parents[1]
    cand = ledger.last(1)[0]
    state = repo / ".ratchet" / "jobs" / "views-moving" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"phase": "setup", "t": 1.0}))
    ledger.update(cand.id, status=Status.SUBMITTED, job_id="views-moving")
    study = serve.ReadOnlyStudy(repo)
    try:
        app = serve.Dashboard(study, "x" * 24, "127.0.0.1", True)

        def moving(study_, snap):  # the worker writes its next phase while the page is made
            shown = serve.overview_view().body(study_, snap)
            state.write_text(json.dumps({"phase": "evaluate", "t": 2.0}))
            return shown

        view = serve.View(title=lambda *_: "t", body=moving)
        body, given, _, _ = app.render(view, True)
        assert "<td>setup</td>" in body and "<td>evaluate</td>" not in body
        assert app.version() != given  # so the page is told, and fetches the new phase
        body, again, _, _ = app.render(serve.overview_view(), True)
        assert "<td>evaluate</td>" in body and app.version() == again
    finally:
        study.close()
        ledger.update(cand.id, status=cand.status, job_id=cand.job_id)


def test_the_live_overview_sends_what_changed_since_the_pages_copy(ledger, monkeypatch):
    """The open overview asks with the render it holds and gets the parts that differ;
    the parts that walk every row are made again only when due (10x what they took),
    and the page is told (the version's '+due') when a newer making is owed."""
    import re

    from ratchet.ui import serve

    repo = Path(ledger.path).parents[1]
    study = serve.ReadOnlyStudy(repo)
    try:
        app = serve.Dashboard(study, "x" * 24, "127.0.0.1", True)
        page, _, _, extra = app.render(serve.overview_view(), False)
        render = int(extra["X-Ratchet-Render"])
        assert f'data-render="{render}"' in page and "data-delta=" in page
        parts = re.findall(r'<div data-part="([a-z-]+)">', page)
        assert {"header", "chart", "counts", "running", "machines"} <= set(parts)

        def delta(since: int) -> tuple[set[str], str, dict[str, str]]:
            body, _, _, extra = app.render(serve.overview_view(), True, since)
            return set(re.findall(r'<div data-part="([a-z-]+)">', body)), body, extra

        shown, _, extra = delta(render)
        assert extra["X-Ratchet-Parts"] == "changed" and "header" not in shown
        assert delta(10**9)[2]["X-Ratchet-Parts"] == "all"  # a render not remembered

        monkeypatch.setattr(serve, "WALK_SHARE", 1e-9)  # the walking parts: never due
        since = int(extra["X-Ratchet-Render"])
        bench.grow(repo, ledger.count(confirmations=True) + 1)  # one more verdict
        shown, body, extra = delta(since)
        assert "header" in shown and "counts" in shown  # the cards and counts follow
        assert not shown & {"chart", "shares", "machines", "costs", "phases"}
        assert app.parts.due is not None and not app.version().endswith("+due")
        monkeypatch.setattr(serve, "WALK_SHARE", 1e9)  # now owed at once
        app.parts.due = 0.0
        assert app.version().endswith("+due")  # the event stream tells the page
        shown, _, extra = delta(int(extra["X-Ratchet-Render"]))
        assert "chart" in shown  # made again, with the new row
        assert app.parts.due is None
    finally:
        study.close()


def test_the_report_pages_its_table_and_writes_only_what_is_new(ledger):
    """Last in this file (it grows the study). The report's table comes in pages of
    PAGE_ROWS by seq, each row on one; its candidates' diffs, asked of git in batches,
    are `git diff`'s; after growth only the new rows' pages and the last table page are
    written again."""
    import html

    from ratchet.job import gitrepo
    from ratchet.ui import pages

    repo = Path(ledger.path).parents[1]
    out = repo / ".ratchet" / "report"
    ratchet(repo, "report", check=True)
    cands = ledger.candidates()
    n_pages = -(-len(cands) // pages.PAGE_ROWS)
    tables = [(out / f"candidates-{n}.html").read_text() for n in range(1, n_pages + 1)]
    assert not (out / f"candidates-{n_pages + 1}.html").exists()
    for cand in cands:  # each row on exactly one page, its own by seq
        on = [n for n, text in enumerate(tables) if f'<span id="{cand.id}">' in text]
        assert on == [cands.index(cand) // pages.PAGE_ROWS], cand.id
    index = (out / "index.html").read_text()
    assert 'id="pager"' in index and 'href="candidates-1.html"' in index
    newest = cands[(n_pages - 1) * pages.PAGE_ROWS:]
    assert all(f'<span id="{c.id}">' in index for c in newest)  # the newest page, inline
    assert f'<span id="{cands[0].id}">' not in index

    pairs = [(c.parent, c.commit_sha) for c in cands if c.parent and c.commit_sha
             and c.parent != c.commit_sha]
    batched = gitrepo.diff_texts(repo, pairs + [("0" * 40, pairs[0][1])])
    for base, head in pairs[::10]:
        assert batched[base, head] == gitrepo.diff_text(repo, base, head)
    assert isinstance(batched["0" * 40, pairs[0][1]], gitrepo.GitError)  # its own fault
    last = next(c for c in reversed(cands) if (c.parent, c.commit_sha) in batched)
    page = (out / "c" / f"{last.id}.html").read_text()
    diff = str(batched[last.parent, last.commit_sha])
    assert html.escape(diff.splitlines()[-1], quote=True) in page

    before = {p.name: p.stat().st_mtime_ns for p in out.rglob("*.html")}
    bench.grow(repo, ledger.count(confirmations=True) + 10)
    ratchet(repo, "report", check=True)
    after = {p.name: p.stat().st_mtime_ns for p in out.rglob("*.html")}
    new = [c.id for c in ledger.candidates()[len(cands):]]
    assert len(new) == 10
    written = {name for name, mtime in after.items() if before.get(name) != mtime}
    last_page = f"candidates-{-(-(len(cands) + 10) // pages.PAGE_ROWS)}.html"
    assert written == {*(f"{i}.html" for i in new), last_page, "index.html"}
