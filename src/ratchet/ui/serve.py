"""`ratchet serve`: the study's views live in a browser, read-only.

A small web app over the ledger, on the standard library's `http.server`: the pages are
the views of `ratchet.ui.pages` (the same functions the static report writes), and a page
left open follows the study through server-sent events (`/events` says when the ledger
moved; the page then fetches its own content again). No web framework: the app serves
a handful of GET routes, the HTML is made by the views already, and the server needs no
async, templates or sessions; a dependency would add install weight and a supply chain
to a tool whose pages show code and logs, for nothing the stdlib lacks here.

Read-only by construction: the ledger is opened with SQLite's `mode=ro` and
`query_only` (`Ledger.readonly`), the study's config is read from the ledger, no
`Study` is built (nothing takes the lock, writes views or touches git refs), and the
server answers GET and HEAD only.

Who may look: whoever holds the token, on loopback too. Bound to 127.0.0.1 by default,
where a request must also name a loopback host (a web page elsewhere cannot reach it by
DNS rebinding); another address needs `--host` and a token given (`--token` or
RATCHET_SERVE_TOKEN). On loopback without one, a fresh random token is made: any process
of this machine can connect to 127.0.0.1 (a candidate of a task with `network = true`, an
agent, another user), and the pages show code, logs and every candidate's output. The
printed address carries the token (`?token=...`), so the page still opens with one click;
the token then lives in an HttpOnly, SameSite=Strict cookie named per port (two servers
on one host keep their own).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.server
import ipaddress
import json
import secrets
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any

from ratchet.core.candidate import Candidate
from ratchet.core.config import CONFIG_FILE, Config
from ratchet.core.errors import UserError
from ratchet.core.vocab import Status
from ratchet.driver import views
from ratchet.driver.config import load_config, loads_config
from ratchet.store.ledger import PAGE_ORDERS, Ledger, LedgerError
from ratchet.ui import blocks, charts, compare, pages
from ratchet.ui.blocks import LIVE, StudyLike

TOKEN_ENV = "RATCHET_SERVE_TOKEN"
TOKEN_COOKIE = "ratchet_token"  # + "_<port>": a browser sends a host's cookies to every port
MIN_TOKEN_CHARS = 16
POLL_S = 0.5  # how often an open event stream looks at the ledger
LOG_REFRESH_S = 2.0  # growing logs alone redraw an open page at most this often
HEARTBEAT_S = 15.0  # a comment line on a quiet stream, so proxies and browsers keep it
LOG_LIMIT = 8 << 20  # the most of one log /log/ sends (its tail)
STRICT_CSP = "default-src 'none'; style-src 'unsafe-inline'; sandbox"


class ServeError(UserError):
    """`ratchet serve` cannot start as asked (one line: what, and how to fix it)."""


# ---------------------------------------------------------------------------------------
# the study, read-only


class ReadOnlyStudy:
    """What the views read, from the ledger alone (opened read-only) and the repo."""

    def __init__(self, repo: Path) -> None:
        self.repo = repo
        self.state_dir = repo / ".ratchet"
        db = self.state_dir / "ledger.db"
        if not db.is_file():
            raise ServeError(f"{repo}: no study here yet (no .ratchet/ledger.db); start it "
                             "with `ratchet run`, then serve it")
        try:
            self.ledger = Ledger.readonly(db)
        except LedgerError as exc:
            raise ServeError(str(exc)) from None
        pinned = self.ledger.study().config
        # the config the study runs with: pinned at its start (an edit since is not in force)
        self.config: Config = (loads_config(pinned.encode(), f"{CONFIG_FILE} pinned at the "
                                            "study's start") if pinned else load_config(repo))
        self.name = self.config.task.name

    @property
    def busy_slots(self) -> int:
        slots = self.config.backend.slots
        parallel = self.config.search.parallel
        return min(parallel, slots) if slots else parallel

    def agent_sandbox_status(self) -> str | None:
        from ratchet.proposers import sandbox_status

        return sandbox_status(self.config.search.proposer, self.config)

    def close(self) -> None:
        self.ledger.close()


def version(study: StudyLike) -> str:
    """A short key that changes whenever what the pages show changes: `structure:growth`.
    Structure: an event, a verdict, a job placed or finished, a phase begun. Growth: the
    logs of running jobs getting longer (a training curve, a log's tail), which the event
    stream passes on at most every LOG_REFRESH_S."""
    db = study.ledger.db
    last_event = db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
    rows = db.execute("SELECT COUNT(*), TOTAL(judged_at), TOTAL(finished_at), "
                      "TOTAL(submitted_at) FROM candidates").fetchone()
    meta = db.execute("SELECT value FROM meta WHERE key IN ('incumbent', 'round', "
                      "'incumbent_samples') ORDER BY key").fetchall()
    running = db.execute("SELECT id, job_id FROM candidates WHERE status = ?",
                         (Status.SUBMITTED.value,)).fetchall()
    phases = [(r["id"], pages.job_state(study, r["job_id"]).get("phase")) for r in running]
    sizes = []
    for r in running:
        for log in pages.live_logs(study, r["job_id"]):
            with contextlib.suppress(OSError):  # a job may end and be cleaned up meanwhile
                sizes.append((r["id"], log.name, log.stat().st_size))
    structure = json.dumps([last_event, list(rows), [m[0] for m in meta], phases], default=str)
    return f"{_short(structure)}:{_short(json.dumps(sizes))}"


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------------
# the pages


SCRIPT = r"""
(() => {
  const live = document.getElementById('live');
  const state = document.getElementById('live-state');
  let version = document.body.dataset.version;
  let busy = false, again = null;
  let sortCol = -1, sortDir = 1;

  function cellKey(row, i) {
    const cell = row.cells[i];
    if (!cell) return '';
    const key = cell.dataset.sort !== undefined ? cell.dataset.sort : cell.textContent.trim();
    const n = Number(key);
    return key !== '' && !Number.isNaN(n) ? n : key.toLowerCase();
  }
  function sortTable() {
    const table = document.getElementById('candidates');
    if (!table || sortCol < 0) return;
    const body = table.tBodies[0];
    const rows = Array.from(body.rows);
    rows.sort((a, b) => {
      const x = cellKey(a, sortCol), y = cellKey(b, sortCol);
      if (x === '' && y !== '') return 1;
      if (y === '' && x !== '') return -1;
      return (x < y ? -1 : x > y ? 1 : 0) * sortDir;
    });
    rows.forEach(r => body.appendChild(r));
    table.querySelectorAll('th').forEach((th, i) => {
      th.classList.toggle('sorted-asc', i === sortCol && sortDir === 1);
      th.classList.toggle('sorted-desc', i === sortCol && sortDir === -1);
    });
  }
  function filterTable() {
    const table = document.getElementById('candidates');
    const text = document.getElementById('filter-text');
    const status = document.getElementById('filter-status');
    if (!table || !text || !status) return;
    const want = text.value.trim().toLowerCase(), st = status.value;
    const col = Array.from(table.tHead.rows[0].cells).findIndex(c => c.textContent === 'status');
    let shown = 0;
    for (const row of table.tBodies[0].rows) {
      const ok = (!want || row.textContent.toLowerCase().includes(want)) &&
                 (!st || row.cells[col].textContent.trim() === st);
      row.hidden = !ok;
      if (ok) shown++;
    }
    const count = document.getElementById('filter-count');
    if (count) count.textContent = shown + ' shown';
  }
  function wire() {
    const table = document.getElementById('candidates');
    if (table) {
      table.querySelectorAll('th').forEach((th, i) => th.addEventListener('click', () => {
        sortDir = sortCol === i ? -sortDir : 1; sortCol = i; sortTable();
      }));
    }
    sortTable(); filterTable(); wireDrag();
  }
  for (const id of ['filter-text', 'filter-status']) {
    const el = document.getElementById(id);
    if (el) el.addEventListener('input', filterTable);
  }
  // the metric chart's zoom (/metric): a range typed, or dragged across the chart
  function zoomTo(from, to) {
    const url = new URL(location.href);
    for (const [key, value] of [['from', from], ['to', to]]) {
      if (value === '' || value === null) url.searchParams.delete(key);
      else url.searchParams.set(key, value);
    }
    location.href = url.pathname + url.search;
  }
  const apply = document.getElementById('zoom-apply');
  if (apply) apply.addEventListener('click', () => zoomTo(
    document.getElementById('zoom-from').value, document.getElementById('zoom-to').value));
  function wireDrag() {
    const svg = document.querySelector('#metric-zoom svg[data-x0]');
    if (!svg) return;
    const NS = 'http://www.w3.org/2000/svg';
    const box = svg.viewBox.baseVal;
    let start = null, band = null;
    const at = (ev) => {
      const r = svg.getBoundingClientRect(), d = svg.dataset;
      const px = (ev.clientX - r.left) * box.width / r.width;
      const x = Number(d.x0) + (px - Number(d.left)) / Number(d.plotWidth) * (Number(d.x1) - Number(d.x0));
      return {px, x};
    };
    svg.addEventListener('mousedown', (ev) => {
      if (ev.button !== 0) return;
      ev.preventDefault();
      start = at(ev);
      band = document.createElementNS(NS, 'rect');
      band.setAttribute('class', 'zoom-band');
      band.setAttribute('y', '0');
      band.setAttribute('height', String(box.height));
      band.setAttribute('fill', 'rgba(21,101,192,0.15)');
      band.setAttribute('pointer-events', 'none');  // a click on a point still reaches it
      svg.appendChild(band);
    });
    svg.addEventListener('mousemove', (ev) => {
      if (!start) return;
      const now = at(ev);
      band.setAttribute('x', String(Math.min(start.px, now.px)));
      band.setAttribute('width', String(Math.abs(now.px - start.px)));
    });
    svg.addEventListener('mouseup', (ev) => {
      if (!start) return;
      const first = start, end = at(ev);
      start = null;
      band.remove();
      if (Math.abs(end.px - first.px) < 6) return;  // a click: a point's link opens
      const from = Math.ceil(Math.min(first.x, end.x)), to = Math.floor(Math.max(first.x, end.x));
      if (from <= to) zoomTo(from, to);
    });
  }
  // two candidates side by side (/compare): the pair picked opens
  for (const id of ['compare-a', 'compare-b']) {
    const el = document.getElementById(id);
    if (el) el.addEventListener('change', () => {
      const pick = (n) => encodeURIComponent(document.getElementById('compare-' + n).value);
      location.href = '/compare?a=' + pick('a') + '&b=' + pick('b');
    });
  }
  async function refresh(want) {
    if (busy) { again = want; return; }
    busy = true;
    try {
      const url = new URL(location.href);
      url.searchParams.set('fragment', '1');
      // a page of parts (the overview) asks only for those changed since its render
      if (document.body.dataset.render) url.searchParams.set('since', document.body.dataset.render);
      const reply = await fetch(url, {cache: 'no-store', credentials: 'same-origin'});
      if (reply.ok) {
        const text = await reply.text();
        if (reply.headers.get('X-Ratchet-Parts') === 'changed') {
          const got = document.createElement('template');
          got.innerHTML = text;  // markup only: scripts in it never run
          for (const part of Array.from(got.content.children)) {
            const old = live.querySelector(
              `:scope > [data-part="${CSS.escape(part.dataset.part || '')}"]`);
            if (old) old.replaceWith(part); else live.appendChild(part);
          }
        } else {
          live.innerHTML = text;  // markup only: scripts in it never run
        }
        const render = reply.headers.get('X-Ratchet-Render');
        if (render) document.body.dataset.render = render;
        version = reply.headers.get('X-Ratchet-Version') || want;
        document.body.dataset.version = version;
        wire();
        state.textContent = 'live · updated ' + new Date().toLocaleTimeString();
      }
    } catch (e) {
      state.textContent = 'offline: ' + e;
    } finally {
      busy = false;
      if (again !== null && again !== version) { const v = again; again = null; refresh(v); }
    }
  }
  const events = new EventSource('/events');
  events.onopen = () => { state.textContent = 'live'; };
  events.onmessage = (e) => { if (e.data !== version) refresh(e.data); };
  events.onerror = () => { state.textContent = 'reconnecting…'; };
  wire();
})();
"""


def csp(nonce: str) -> str:
    """The live page runs only the server's own script (by nonce): no inline handler,
    no script a candidate's text could smuggle in, nothing from elsewhere."""
    return (f"default-src 'none'; script-src 'nonce-{nonce}'; connect-src 'self'; "
            "img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'")


@dataclass(frozen=True)
class View:
    title: Callable[[StudyLike, blocks.Snapshot], str]
    body: Callable[[StudyLike, blocks.Snapshot], str]
    above: Callable[[blocks.Snapshot], str] = lambda _snap: ""  # outside the live part
    # a view made of named parts (the overview): the page asks for those that changed
    parts: Callable[[StudyLike, blocks.Snapshot], list[tuple[str, bool, Callable[[], str]]]] \
        | None = None


def overview_view() -> View:
    def parts(study: StudyLike, snap: blocks.Snapshot) -> list[tuple[str, bool, Callable[[], str]]]:
        title = f"ratchet: {study.name}"
        return [("header", False, lambda: pages.header(study, snap, title)),
                *pages.overview_parts(study, snap, LIVE)]

    def body(study: StudyLike, snap: blocks.Snapshot) -> str:
        return "\n".join(s for s in (make() for _n, _w, make in parts(study, snap)) if s)

    return View(title=lambda study, _s: f"ratchet: {study.name}", body=body, parts=parts)


WALK_SHARE = 0.1  # the most of a core an open overview spends on its parts that walk every row
SENT_KEPT = 64  # renders remembered for the pages that ask what changed since theirs


class Parts:
    """The overview's parts as last made and sent. The parts that walk every row
    (charts, shares, machines, costs) are made again together, and only when they are
    older than 1/WALK_SHARE times what they took to make (a study of 50 rows: each time;
    of 10,000: every few seconds), so a page following a large study costs what changed,
    not the study; until then they are served as made, and `due` says when newer ones
    are owed (the event stream then tells the page). A page asks with the render it
    holds (`since`) and gets only the parts whose text differs from what that sent."""

    def __init__(self) -> None:
        self.made: dict[str, str] = {}  # the walking parts' html, as last made
        self.walked_at: float | None = None  # when they were made (monotonic)
        self.walk_took = 0.0  # and what they took, together
        self.walk_rev: str | None = None  # the study's state they show (version())
        self.sent: dict[int, dict[str, str]] = {}  # render: {part: digest}
        self.renders = 0
        self.due: float | None = None  # when walking parts older than the ledger are owed

    def make(self, parts: list[tuple[str, bool, Callable[[], str]]], rev: str
             ) -> tuple[int, list[tuple[str, str]]]:
        now = time.monotonic()
        walk = (self.walked_at is None or now - self.walked_at >= self.walk_took / WALK_SHARE
                or any(walks and name not in self.made for name, walks, _ in parts))
        out, took = [], 0.0
        for name, walks, make in parts:
            if walks and not walk:
                out.append((name, self.made[name]))
                continue
            start = time.monotonic()
            html = make()
            if walks:
                took += time.monotonic() - start
                self.made[name] = html
            out.append((name, html))
        if walk:
            self.walked_at, self.walk_took, self.walk_rev = now, took, rev
        self.due = (None if self.walk_rev == rev or self.walked_at is None
                    else self.walked_at + self.walk_took / WALK_SHARE)
        self.renders += 1
        self.sent[self.renders] = {name: _short(html) for name, html in out}
        for old in [r for r in self.sent if r <= self.renders - SENT_KEPT]:
            del self.sent[old]
        return self.renders, out

    def changed(self, since: int | None, render: int) -> list[str] | None:
        """The parts of `render` whose text differs from what render `since` sent; None
        when `since` is not remembered (the page then takes them all)."""
        before = self.sent.get(since) if since is not None else None
        if before is None:
            return None
        now = self.sent[render]
        return [name for name, digest in now.items() if before.get(name) != digest]


@dataclass(frozen=True)
class TableQuery:
    """One page of the candidates table, as its address asks: `?page=2&status=keep&q=
    text&sort=metric&desc=1` (sorted, filtered and cut in SQL: Ledger.page)."""

    page: int = 1
    status: str | None = None
    text: str | None = None
    sort: str = "seq"
    desc: bool = True  # the newest first

    @classmethod
    def of(cls, query: dict[str, list[str]]) -> TableQuery:
        one = {k: v[0] for k, v in query.items() if v}
        sort = one.get("sort", "seq")
        page = one.get("page", "1")
        return cls(page=max(1, int(page)) if page.isdigit() else 1,
                   status=one.get("status") or None, text=one.get("q") or None,
                   sort=sort if sort in PAGE_ORDERS else "seq",
                   desc=one.get("desc", "1") != "0")

    def link(self, **change: Any) -> str:
        want = {"page": self.page, "status": self.status, "q": self.text, "sort": self.sort,
                "desc": int(self.desc), **change}
        keep = {k: v for k, v in want.items() if v not in (None, "")}
        return "/candidates?" + urllib.parse.urlencode(keep)


def pager(query: TableQuery, total: int, counts: dict[str, int]) -> str:
    """Where this page lies in the table, the way to the others, and the filters and
    orders the server applies (the headers sort and the box filters the page shown)."""
    size = pages.PAGE_ROWS
    last = max(1, -(-total // size))
    first = (query.page - 1) * size
    out = [f'<p class="note" id="pager">rows {min(total, first + 1):,}–'
           f"{min(total, first + size):,} of {total:,}"]
    if query.page > 1:
        out.append(f' · <a href="{blocks._e(query.link(page=query.page - 1))}">previous</a>')
    if query.page < last:
        out.append(f' · <a href="{blocks._e(query.link(page=query.page + 1))}">next</a>'
                   f' · <a href="{blocks._e(query.link(page=last))}">last</a>')
    out.append(f" · page {query.page} of {last}</p>")
    statuses = [f'<a href="{blocks._e(query.link(page=1, status=None))}">any status</a>'] + [
        f'<a href="{blocks._e(query.link(page=1, status=s))}">{blocks._e(s)} ({n:,})</a>'
        for s, n in sorted(counts.items())]
    orders = [f'<a href="{blocks._e(query.link(page=1, sort=o, desc=int(o == "seq")))}">'
              f"{blocks._e('newest' if o == 'seq' else o)}</a>"
              for o in ("seq", "metric", "gain", "status", "round")]
    out.append(f'<p class="note" id="server-filters">status: {" · ".join(statuses)}; '
               f'order: {" · ".join(orders)}</p>')
    return "".join(out)


def candidates_view(query: TableQuery | None = None) -> View:
    query = query or TableQuery()

    def body(study: StudyLike, snap: blocks.Snapshot) -> str:
        ledger = study.ledger
        rows, total = ledger.page((query.page - 1) * pages.PAGE_ROWS, pages.PAGE_ROWS,
                                  status=query.status, text=query.text, order=query.sort,
                                  descending=query.desc)
        return (f"<h1>Candidates of {blocks._e(study.name)}</h1>"
                + pager(query, total, ledger.status_counts(confirmations=False))
                + pages.candidate_table(study, snap, LIVE, rows))

    return View(title=lambda study, _s: f"candidates: {study.name}", body=body,
                above=lambda snap: pages.candidate_filters(snap)
                + '<p class="note" id="filter-count"></p>')


def metric_view(query: charts.MetricQuery) -> View:
    # the controls sit outside the live part: a redraw keeps what is typed in them
    return View(title=lambda study, _s: f"{study.config.metric.name}: {study.name}",
                body=lambda _study, snap: charts.metric_page(snap, LIVE, query)[1],
                above=lambda snap: charts.metric_page(snap, LIVE, query, chart=False)[0])


def compare_view(a: str | None, b: str | None) -> View:
    def pair(study: StudyLike, snap: blocks.Snapshot) -> tuple[str, str]:
        first, second = compare.defaults(snap)
        return a or first or "", b or second or ""

    def body(study: StudyLike, snap: blocks.Snapshot) -> str:
        one, two = pair(study, snap)
        if not one or not two:
            return '<p class="note">no two candidates to compare yet.</p>'
        return compare.page(study, snap, one, two, LIVE)

    return View(title=lambda study, _s: f"compare: {study.name}", body=body,
                above=lambda snap: compare.pickers(snap, a, b))


def candidate_view(cand_id: str) -> View:
    def body(study: StudyLike, snap: blocks.Snapshot) -> str:
        cand = snap.by_id(cand_id)
        if cand is None:
            raise LookupError(cand_id)
        return pages.candidate_page(study, snap, cand, LIVE)

    return View(title=lambda study, _s: f"{cand_id}: {study.name}", body=body)


# ---------------------------------------------------------------------------------------
# the server


class Rows:
    """Every row of the ledger, kept in memory between requests: after a change only the
    rows written since (their revision, Ledger.rows_since) are read again, so a page
    that follows a study of 10,000 candidates costs what changed, not the study."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.rev: int | None = None
        self.by_id: dict[str, Candidate] = {}
        self.rows: list[Candidate] = []

    def current(self) -> list[Candidate]:
        rev = self.ledger.revision()
        if rev == 0:  # a ledger older than schema 7 numbers no change: read whole
            return self.ledger.rows_since(None)
        count = self.ledger.db.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
        if self.rev is None or rev < self.rev or count < len(self.by_id):  # another study
            self.by_id = {c.id: c for c in self.ledger.rows_since(None)}
        elif rev != self.rev:
            self.by_id.update((c.id, c) for c in self.ledger.rows_since(self.rev))
        else:
            return self.rows
        self.rev = rev
        self.rows = sorted(self.by_id.values(), key=lambda c: c.seq)
        return self.rows


class Dashboard:
    """The study, the token, and one lock: SQLite connections are used by one thread at a
    time, and the views read one consistent look at the ledger."""

    def __init__(self, study: ReadOnlyStudy, token: str, host: str, loopback: bool,
                 log: Callable[[str], None] = lambda _m: None) -> None:
        self.study = study
        self.token = token
        self.host = host
        self.loopback = loopback
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.log = log
        self.port = 0
        self.rows = Rows(study.ledger)
        self.parts = Parts()

    @property
    def cookie(self) -> str:
        return f"{TOKEN_COOKIE}_{self.port}"

    def version(self) -> str:
        with self.lock:
            now = version(self.study)
            due = self.parts.due
        # a part served older than the ledger is owed: a new growth key tells the page
        return now + "+due" if due is not None and time.monotonic() >= due else now

    def render(self, view: View, fragment: bool, since: int | None = None
               ) -> tuple[str, str, str, dict[str, str]]:
        """(html, version, policy, headers) of a view: its live part alone (of a view
        made of parts, those changed since render `since` only), or the whole page."""
        extra: dict[str, str] = {}
        with self.lock:
            # the version first, then what it stands for: a phase or row that moves while
            # the body is made leaves the page an older version than it shows, so the next
            # event fetches again; read after, it could name a state the body never showed,
            # and the page, thinking itself current, would skip that state (a job's
            # `evaluate` phase never seen)
            now = version(self.study)
            rows = self.rows.current()
            snap = blocks.snapshot(self.study, rows)
            if view.parts is not None:
                # what the parts show moves with the version's structure (rows, events,
                # phases): a ledger too old to number its rows changes it too
                render, made = self.parts.make(view.parts(self.study, snap), now.split(":")[0])
                changed = self.parts.changed(since, render) if fragment else None
                shown = made if changed is None else [p for p in made if p[0] in changed]
                body = "\n".join(f'<div data-part="{name}">{html}</div>' for name, html in shown)
                extra = {"X-Ratchet-Render": str(render),
                         "X-Ratchet-Parts": "all" if changed is None else "changed"}
            else:
                body = view.body(self.study, snap)
            title = view.title(self.study, snap)
            above = view.above(snap)
        if fragment:
            return body, now, STRICT_CSP, extra
        nonce = secrets.token_urlsafe(16)
        shell = (f'{pages.nav(LIVE, "<span id=live-state>connecting…</span>")}{above}'
                 f'<main id="live">{body}</main>'
                 f'<script nonce="{nonce}">{SCRIPT}</script>')
        # a view of parts: the page asks for what changed since the render it holds
        delta = (f' data-render="{extra["X-Ratchet-Render"]}" data-delta="'
                 f'{blocks._e("/?fragment=1&since={since}")}"' if extra else "")
        html = pages.page(title, shell, csp(nonce)).replace(
            "<body>", f'<body data-version="{blocks._e(now)}"{delta}>', 1)
        return html, now, csp(nonce) + "; frame-ancestors 'none'", extra

    def log_text(self, cand_id: str, index: int) -> str | None:
        with self.lock:
            cand = self.study.ledger.candidate(cand_id)
        phases = (cand.phases or []) if cand else []
        if not 0 <= index < len(phases):
            return None
        rel = blocks.log_under(phases[index].get("log"), self.study.state_dir)
        if rel is None:
            return None
        text, before = blocks.read_tail(self.study.state_dir / rel, LOG_LIMIT)
        return (f"[{before} earlier bytes not shown]\n" if before else "") + text

    def summary(self) -> dict[str, Any]:
        """/api/summary: the headline and counts, for scripts (the same pooled numbers)."""
        with self.lock:
            config = self.study.config
            head = views.headline(self.study.ledger, config.metric.name, config.metric.goal,
                                  config.acceptance.noise == "ignore")
            return {"study": self.study.name, "version": version(self.study),
                    "headline": head.as_dict(), "incumbent_id": head.incumbent_id,
                    "counts": self.study.ledger.status_counts()}


class Handler(http.server.BaseHTTPRequestHandler):
    server_version = "ratchet-serve"
    sys_version = ""
    protocol_version = "HTTP/1.1"
    app: Dashboard  # set on the subclass made per server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # quiet: the terminal is the study's, and a page polls

    # -- guards -------------------------------------------------------------------------

    def _host_allowed(self) -> bool:
        """On loopback, only requests that name a loopback host (DNS rebinding: a page
        on some site whose name resolves to 127.0.0.1 would name that site)."""
        if not self.app.loopback:
            return True
        host = (self.headers.get("Host") or "").strip().lower()
        name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]")[0] + "]"
        return name in ("127.0.0.1", "localhost", "[::1]", "::1") or name.startswith("127.")

    def _token_ok(self, query: dict[str, list[str]]) -> bool | str:
        """True, False, or the token given in the URL (to be moved into a cookie)."""
        token = self.app.token
        given = query.get("token", [None])[0]
        if given is not None and hmac.compare_digest(given.encode(), token.encode()):
            return given
        auth = self.headers.get("Authorization") or ""
        if auth.startswith("Bearer ") and hmac.compare_digest(auth[7:].encode(), token.encode()):
            return True
        for part in (self.headers.get("Cookie") or "").split(";"):
            name, _, value = part.strip().partition("=")
            if name == self.app.cookie and hmac.compare_digest(value.encode(), token.encode()):
                return True
        return False

    # -- replies ------------------------------------------------------------------------

    def _headers(self, status: int, ctype: str, length: int | None, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        if length is not None:
            self.send_header("Content-Length", str(length))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")  # a log is never run as script
        self.send_header("X-Frame-Options", "DENY")
        self.send_header("Referrer-Policy", "no-referrer")
        extra = dict(extra or {})
        # every reply carries a policy: a page its own, anything else (a fragment opened
        # by itself, a log, JSON) none that could run or load a thing
        self.send_header("Content-Security-Policy", extra.pop("Content-Security-Policy", STRICT_CSP))
        for key, value in extra.items():
            self.send_header(key, value)
        self.end_headers()

    def _send(self, status: int, body: str, ctype: str = "text/html; charset=utf-8",
              extra: dict[str, str] | None = None) -> None:
        data = body.encode("utf-8")
        self._headers(status, ctype, len(data), extra)
        if self.command != "HEAD":
            self.wfile.write(data)

    def _error(self, status: HTTPStatus, text: str) -> None:
        body = pages.page(f"{status.value} {status.phrase}",
                          f"<h1>{status.value} {blocks._e(status.phrase)}</h1><p>{blocks._e(text)}</p>",
                          "default-src 'none'; style-src 'unsafe-inline'")
        self._send(status.value, body)

    # -- verbs --------------------------------------------------------------------------

    def do_POST(self) -> None:  # noqa: N802 - the stdlib's name
        self._error(HTTPStatus.METHOD_NOT_ALLOWED, "read-only: this server changes nothing")

    do_PUT = do_DELETE = do_PATCH = do_POST  # noqa: N815

    def do_HEAD(self) -> None:  # noqa: N802
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query)
        if not self._host_allowed():
            self._error(HTTPStatus.FORBIDDEN, "this server answers requests for 127.0.0.1 or "
                        "localhost only")
            return
        ok = self._token_ok(query)
        if ok is False:
            self._error(HTTPStatus.UNAUTHORIZED, "a token is required: open the address "
                        "`ratchet serve` printed (it carries ?token=...)")
            return
        if isinstance(ok, str):  # into a cookie, and out of the address bar and history
            rest = {k: v for k, v in query.items() if k != "token"}
            target = url.path + (f"?{urllib.parse.urlencode(rest, doseq=True)}" if rest else "")
            self._send(HTTPStatus.SEE_OTHER.value, "", extra={
                "Location": target,
                "Set-Cookie": f"{self.app.cookie}={ok}; HttpOnly; SameSite=Strict; Path=/"})
            return
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the browser left
            self._route(url.path, query)

    def _route(self, path: str, query: dict[str, list[str]]) -> None:
        fragment = query.get("fragment", ["0"])[0] == "1"
        parts = [p for p in path.split("/") if p]
        if path == "/events":
            if self.command == "HEAD":
                self._headers(200, "text/event-stream", None)
            else:
                self._events()
            return
        if path == "/api/summary":
            self._send(200, json.dumps(self.app.summary()), "application/json")
            return
        if parts[:1] == ["log"] and len(parts) == 3 and parts[2].isdigit():
            text = self.app.log_text(parts[1], int(parts[2]))
            if text is None:
                self._error(HTTPStatus.NOT_FOUND, "no such log")
            else:
                self._send(200, text, "text/plain; charset=utf-8")
            return
        if path in ("/", "/index.html"):
            view = overview_view()
        elif path == "/candidates":
            view = candidates_view(TableQuery.of(query))
        elif parts[:1] == ["c"] and len(parts) == 2:
            view = candidate_view(parts[1])
        elif path == "/metric":
            view = metric_view(charts.MetricQuery.of(query))
        elif path == "/compare":
            view = compare_view(query.get("a", [""])[0] or None, query.get("b", [""])[0] or None)
        else:
            self._error(HTTPStatus.NOT_FOUND, f"no page {path}")
            return
        since = query.get("since", [""])[0]
        try:
            html, now, policy, extra = self.app.render(
                view, fragment, int(since) if since.isdigit() else None)
        except LookupError:
            self._error(HTTPStatus.NOT_FOUND, "no such candidate in this study")
            return
        except Exception as exc:  # noqa: BLE001 - one page failing never stops the server
            self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"this page could not be made: "
                        f"{type(exc).__name__}: {exc} (the other pages still work)")
            return
        self._send(200, html, extra={"X-Ratchet-Version": now, "Content-Security-Policy": policy,
                                     **extra})

    def _events(self) -> None:
        """Server-sent events: the version whenever the study moves, and at most every
        LOG_REFRESH_S while only running jobs' logs grow (an open page redraws on each)."""
        self._headers(200, "text/event-stream", None, {"Connection": "close"})
        self.close_connection = True
        sent, at = "", 0.0
        while not self.app.stopping.is_set():
            now = self.app.version()
            moved = now.split(":")[0] != sent.split(":")[0]
            grew = now != sent and time.monotonic() - at >= LOG_REFRESH_S
            if moved or grew:
                self.wfile.write(f"retry: 2000\ndata: {now}\n\n".encode())
                self.wfile.flush()
                sent, at = now, time.monotonic()
            elif time.monotonic() - at > HEARTBEAT_S:
                self.wfile.write(b": still here\n\n")
                self.wfile.flush()
                at = time.monotonic()
            self.app.stopping.wait(POLL_S)


class Server(http.server.ThreadingHTTPServer):
    daemon_threads = True  # an open event stream never holds the process at exit
    allow_reuse_address = True


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve anywhere


def check_bind(host: str, token: str | None) -> None:
    """Any address but loopback needs a token given (loopback makes its own); a token given
    must have some length."""
    if token is not None and len(token) < MIN_TOKEN_CHARS:
        raise ServeError(f"the token is too short ({len(token)} characters): use at least "
                         f"{MIN_TOKEN_CHARS}, e.g. `python -c 'import secrets; "
                         "print(secrets.token_urlsafe(24))'`")
    if not is_loopback(host) and token is None:
        raise ServeError(f"--host {host} would show the study's code and logs to the network: "
                         f"also pass --token TOKEN (or set {TOKEN_ENV}), or bind 127.0.0.1 "
                         "and reach it through an SSH tunnel")


def make_server(repo: Path, host: str = "127.0.0.1", port: int = 0,
                token: str | None = None) -> tuple[Server, Dashboard]:
    check_bind(host, token)
    study = ReadOnlyStudy(repo)
    # loopback is no boundary on a shared machine: a token always, made here if not given
    app = Dashboard(study, token or secrets.token_urlsafe(24), host, is_loopback(host))
    handler = type("BoundHandler", (Handler,), {"app": app})
    try:
        server = Server((host.strip("[]"), port), handler)
    except OSError as exc:
        study.close()
        raise ServeError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (choose "
                         "another --port, or 0 for any free one)") from None
    app.port = server.server_address[1]
    with app.lock:  # the rows read once now, not on the first page asked for
        app.rows.current()
    return server, app


def url_of(app: Dashboard) -> str:
    host = app.host if ":" not in app.host else f"[{app.host.strip('[]')}]"
    return f"http://{host}:{app.port}/?token={urllib.parse.quote(app.token)}"


def serve_forever(server: Server, app: Dashboard) -> None:
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        app.stopping.set()
        server.server_close()
        app.study.close()
