"""`ratchet report`: the study's views written as static HTML files.

`.ratchet/report/index.html` (the overview and the newest page of the candidate table),
`candidates-N.html` (the table, PAGE_ROWS rows a page, oldest first) and one page per
candidate under `.ratchet/report/c/`. Every view comes from `ratchet.ui.pages`, the
same functions `ratchet serve` sends live, so the two never disagree. Each page holds
everything inline (CSS, charts as inline SVG), so it can be mailed, archived or opened
from a job machine without a server.

Written incrementally, so a study of 10,000 candidates reports in about a minute and
again in seconds: a candidate's page is written when its row (or a row measuring the same
commit: a confirmation pair, a re-measure) changed since the last report, which for a
judged candidate is once, at its verdict (the page shows nothing that moves with the
incumbent afterwards). What was written is recorded in `.written.json`: each file's key
(ratchet's version and the highest row revision it shows). A table page is written again
only when one of its rows changed; index.html every time, from the ledger's aggregates.
The diffs of the pages to write are asked of git in batches (`gitrepo.diff_texts`).

Candidate text is untrusted: the views escape it, and the pages' Content-Security-Policy
allows no script at all, so even a slip in escaping could not run code.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

from ratchet import __version__
from ratchet.core.candidate import Candidate
from ratchet.driver import spend
from ratchet.job import gitrepo
from ratchet.ui import blocks, pages
from ratchet.ui.blocks import Site, StudyLike

REPORT_DIR = "report"
MANIFEST = ".written.json"  # {"study": stamp, "pages": {file: key}}
SAVE_EVERY = 1000  # pages between two saves of the manifest: a stopped report keeps them
# No scripts, no remote anything: charts are inline SVG, styles inline.
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
       "form-action 'none'")


def write_report(study: StudyLike, rows: list[Candidate] | None = None) -> Path:
    """Render the study's ledger to `.ratchet/report/`; returns index.html's path.
    `rows`: every row (Ledger.rows_since(None)) where the caller read them already."""
    out_dir = Path(study.state_dir) / REPORT_DIR
    (out_dir / "c").mkdir(parents=True, exist_ok=True)
    snap = blocks.snapshot(study, study.ledger.rows_since(None) if rows is None else rows)
    written = Written(out_dir, _stamp(snap))
    todo = [(f"c/{c.id}.html", c, key) for c in snap.everything
            if written.stale(f"c/{c.id}.html", key := _key(snap, [c]))]
    # every diff these pages show, a git process per batch instead of one per page
    snap.diffs.update(gitrepo.diff_texts(Path(study.repo), [
        (c.parent, c.commit_sha) for _, c, _ in todo
        if c.parent and c.commit_sha and c.parent != c.commit_sha]))
    if todo:  # what each page's spend lines read, once for all of them
        snap.steps = spend.kept_steps(study.ledger)[0]
        snap.row_spend = spend.per_candidate(study.ledger)
    for name, cand, key in todo:
        _write(out_dir / name, render_candidate(study, snap, cand.id))
        written.done(name, key)
    tables = table_pages(snap.cands)
    hosts = _short(repr(sorted(snap.hosts.labels.items())))  # a row's machine cell
    for n, shown in enumerate(tables, 1):
        name = table_name(n)
        # a page links its neighbours only: a new page at the end writes its one before
        key = f"{_key(snap, shown)}:{len(shown)}:{n < len(tables)}:{hosts}"
        if written.stale(name, key):
            _write(out_dir / name, render_table(study, snap, n, tables))
            written.done(name, key)
    written.save()
    path = out_dir / "index.html"
    _write(path, render(study, snap))
    return path


class Written:
    """What earlier reports wrote (the manifest), checked against the files there."""

    def __init__(self, out_dir: Path, stamp: str) -> None:
        self.path = out_dir / MANIFEST
        self.stamp = stamp
        self.since_save = 0
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            data = {}
        # another study in this folder (a reset), another ratchet: nothing of it counts
        known = data.get("pages") if isinstance(data, dict) and data.get("study") == stamp \
            else None
        self.pages: dict[str, str] = known if isinstance(known, dict) else {}
        # one listing per folder, not a stat per page: a page removed is written again
        self.present = {f"c/{n}" for n in _listing(out_dir / "c")} | set(_listing(out_dir))

    def stale(self, name: str, key: str) -> bool:
        return self.pages.get(name) != key or name not in self.present

    def done(self, name: str, key: str) -> None:
        self.pages[name] = key
        self.since_save += 1
        if self.since_save >= SAVE_EVERY:
            self.save()

    def save(self) -> None:
        _write(self.path, json.dumps({"study": self.stamp, "pages": self.pages}))
        self.since_save = 0


def _listing(folder: Path) -> list[str]:
    try:
        return os.listdir(folder)
    except OSError:
        return []


def _stamp(snap: blocks.Snapshot) -> str:
    """Which study and which ratchet wrote the pages: the first row's id and time (the
    earliest made: confirmation rows are numbered apart, so not the first by seq)."""
    first = min(snap.everything, key=lambda r: (r.created_at, r.id), default=None)
    return f"{__version__}:{first.id if first else ''}:{first.created_at if first else ''}"


def _key(snap: blocks.Snapshot, rows: list[Candidate]) -> str:
    """The highest revision of the rows a page shows and of the rows measuring the same
    (a confirmation pair, another evaluation of the commit: its pooled estimate)."""
    return str(max((r.rev for c in rows for r in (c, *snap.related(c))), default=0))


def _short(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a page


def table_pages(cands: list[Candidate]) -> list[list[Candidate]]:
    """The candidate table cut into pages by seq, oldest first: a study that grows adds
    rows to its last page only, so the pages before it stay as written."""
    size = pages.PAGE_ROWS
    return [cands[i:i + size] for i in range(0, len(cands), size)]


def table_name(n: int) -> str:
    return f"candidates-{n}.html"


def pager(total: int) -> str:
    """index.html's links to every page of the table (candidates-N.html)."""
    if total <= 1:
        return ""
    links = " ".join(f'<a href="{table_name(i)}">{i}</a>' for i in range(1, total + 1))
    return (f'<p class="note" id="pager">{pages.PAGE_ROWS} candidates a page, oldest '
            f"first: {links}; the newest below</p>")


def neighbours(n: int, total: int) -> str:
    """A table page's way to the pages beside it and to the index (which lists all)."""
    links = [f'<a href="{table_name(n - 1)}">previous</a>'] if n > 1 else []
    links.append('<a href="index.html#candidates-title">every page</a>')
    if n < total:
        links.append(f'<a href="{table_name(n + 1)}">next</a>')
    return f'<p class="note" id="pager">page {n}: {" · ".join(links)}</p>'


def render(study: StudyLike, snap: blocks.Snapshot | None = None) -> str:
    """index.html as a string: the overview, then the newest page of the candidates."""
    snap = snap or blocks.snapshot(study)
    site = Site(live=False)
    title = f"ratchet report: {study.name}"
    tables = table_pages(snap.cands)
    newest = tables[-1] if tables else []
    body = [pages.nav(site), pages.header(study, snap, title),
            *pages.overview_sections(study, snap, site),
            '<h2 id="candidates-title">Candidates</h2>',
            pager(len(tables)),
            pages.candidate_table(study, snap, site, newest) if newest
            else '<p class="note">no candidates.</p>', _footer(study)]
    return pages.page(title, "\n".join(s for s in body if s), CSP)


def render_table(study: StudyLike, snap: blocks.Snapshot, n: int,
                 tables: list[list[Candidate]]) -> str:
    """candidates-N.html: the Nth page of the candidate table."""
    site = Site(live=False)
    title = f"candidates, page {n}: {study.name}"
    body = [pages.nav(site), f"<h1>{blocks._e(title)}</h1>", neighbours(n, len(tables)),
            pages.candidate_table(study, snap, site, tables[n - 1]), _footer(study)]
    return pages.page(title, "\n".join(s for s in body if s), CSP)


def render_candidate(study: StudyLike, snap: blocks.Snapshot, cand_id: str) -> str:
    site = Site(live=False, root="../")
    cand = snap.by_id(cand_id)
    if cand is None:
        raise LookupError(f"{cand_id}: not in the ledger")
    body = [pages.nav(site), pages.candidate_page(study, snap, cand, site,
                                                  against_incumbent=False), _footer(study)]
    return pages.page(f"{cand.id}: {study.name}", "\n".join(body), CSP)


def _footer(study: StudyLike) -> str:
    return (f'<p class="note">generated {blocks._e(time.strftime("%Y-%m-%d %H:%M:%S"))} from '
            f"{blocks._e(str(study.ledger.path))}</p>")
