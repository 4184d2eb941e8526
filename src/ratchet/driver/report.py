"""`ratchet report`: the study's views written as static HTML files.

`.ratchet/report/index.html` (the overview and the candidate table) and one page per
candidate under `.ratchet/report/c/`. Every view comes from `ratchet.driver.pages`, the same
functions `ratchet serve` sends live, so the two never disagree. Each page holds
everything inline (CSS, charts as inline SVG), so it can be mailed, archived or opened
from a job machine without a server. Like `results.tsv` the files are rebuilt whole from
the ledger each time and never read back.

Candidate text is untrusted: the views escape it, and the pages' Content-Security-Policy
allows no script at all, so even a slip in escaping could not run code.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from ratchet import __version__
from ratchet.driver import pages
from ratchet.driver.pages import Site, StudyLike

REPORT_DIR = "report"
# No scripts, no remote anything: charts are inline SVG, styles inline.
CSP = ("default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; "
       "form-action 'none'")


def write_report(study: StudyLike) -> Path:
    """Render the study's ledger to `.ratchet/report/`; returns index.html's path."""
    out_dir = Path(study.state_dir) / REPORT_DIR
    (out_dir / "c").mkdir(parents=True, exist_ok=True)
    snap = pages.snapshot(study)
    incumbent = study.ledger.get("incumbent")
    for cand in snap.everything:
        # a page is made again only when what it shows may have changed: its row, the
        # incumbent it is compared with, its commit's pooled estimate
        est = snap.estimate(cand.commit_sha)
        key = hashlib.sha256(repr((__version__, cand.status, cand.judged_at, cand.finished_at,
                                   cand.idea, incumbent, est and (est.mean, est.n, est.low))).encode()
                             ).hexdigest()[:20]
        page = out_dir / "c" / f"{cand.id}.html"
        if _key_of(page) != key:
            text = render_candidate(study, snap, cand.id)
            _write(page, text.replace("\n", f"\n<!-- {key} -->\n", 1))  # after the doctype
    path = out_dir / "index.html"
    _write(path, render(study, snap))
    return path


def _key_of(page: Path) -> str | None:
    """The key a candidate's page was written for (its second line), None if unreadable."""
    try:
        with open(page, encoding="utf-8") as f:
            f.readline()  # <!DOCTYPE html>
            line = f.readline()
    except (OSError, UnicodeDecodeError):
        return None
    return line[5:-5] if line.startswith("<!-- ") and line.endswith(" -->\n") else None


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)  # a reader never sees half a page


def render(study: StudyLike, snap: pages.Snapshot | None = None) -> str:
    """index.html as a string: the overview, then every candidate."""
    snap = snap or pages.snapshot(study)
    site = Site(live=False)
    title = f"ratchet report: {study.name}"
    body = [pages.nav(site), pages.header(study, snap, title),
            *pages.overview_sections(study, snap, site),
            '<h2 id="candidates-title">Candidates</h2>',
            pages.candidate_table(study, snap, site), _footer(study)]
    return pages.page(title, "\n".join(s for s in body if s), CSP)


def render_candidate(study: StudyLike, snap: pages.Snapshot, cand_id: str) -> str:
    site = Site(live=False, root="../")
    cand = snap.by_id(cand_id)
    if cand is None:
        raise LookupError(f"{cand_id}: not in the ledger")
    body = [pages.nav(site), pages.candidate_page(study, snap, cand, site), _footer(study)]
    return pages.page(f"{cand.id}: {study.name}", "\n".join(body), CSP)


def _footer(study: StudyLike) -> str:
    return (f'<p class="note">generated {pages._e(time.strftime("%Y-%m-%d %H:%M:%S"))} from '
            f"{pages._e(str(study.ledger.path))}</p>")
