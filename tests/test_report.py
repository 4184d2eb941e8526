"""`ratchet report`: a real study, the real CLI, the page loaded in a real headless Chromium.

The page is judged by what a browser makes of it (the dumped DOM and a screenshot), not
by the HTML text alone: the rows, statuses, the plot image, and a candidate whose
commit subject is a `<script>` rendering as inert text.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import sys
import textwrap
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from helpers import HOLDOUT_EVALUATOR, config_text, git, make_repo, ratchet

from ratchet.store.ledger import Ledger

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (apt-get install chromium; .ci/run installs it)",
)

XSS = "<script>document.title='pwned'</script>"

# The hold-out disagrees at X = 1.2 (tests/helpers.py): rejected as overfit.
EVALUATOR = HOLDOUT_EVALUATOR

SOLUTION = '''
"""Editable."""

X = 3.0  # the knob


def score():
    return (X - 1.25) ** 2
'''

TASK = textwrap.dedent('''
    [task]
    name = "demo"
    editable = ["solution.py"]
    protected = ["evaluate.py"]
    evaluate = "python evaluate.py"
    holdout = "python evaluate.py --holdout"
    timeout = "60s"
''')


def study_repo(path: Path) -> Path:
    return make_repo(path, {"ratchet.toml": config_text(task=TASK), "evaluate.py": EVALUATOR,
                            "solution.py": SOLUTION})


def commit_on_incumbent(repo: Path, branch: str, subject: str, rel: str, text: str) -> str:
    """A commit on top of the study's current incumbent (as an agent would make)."""
    git(repo, "checkout", "-q", "-B", branch, "ratchet/demo")
    (repo / rel).write_text(text)
    git(repo, "commit", "-qam", subject)
    git(repo, "checkout", "-q", "main")
    return branch


def with_x(x: str) -> str:
    return SOLUTION.lstrip("\n").replace("X = 3.0", f"X = {x}")


def submit_and_wait(repo: Path, rev: str) -> str:
    proc = ratchet(repo, "submit", rev)
    assert proc.returncode == 0, proc.stderr
    cand_id = proc.stdout.strip().splitlines()[-1]
    proc = ratchet(repo, "wait", cand_id)
    assert proc.returncode == 0, proc.stderr
    return cand_id


class Tables(HTMLParser):
    """Every table row's cell texts, and the attributes of every <img> and <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self.images: list[dict[str, str]] = []
        self.scripts = 0
        self.title = ""
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self._in_title = False
        self._title_in_svg = False
        self._svg_depth = 0
        self._g_depth = 0
        self.svg_titles: list[str] = []
        self.marks: dict[str, str] = {}  # chart point: candidate id -> its metric

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self._row = []
        elif tag in ("td", "th"):
            self._cell = []
        elif tag == "img":
            self.images.append(dict(attrs))
        elif tag == "script":
            self.scripts += 1
        elif tag == "title":
            self._in_title = True
            # a chart's own title: in an <svg>, not in one of its marks (<g>)
            self._title_in_svg = self._svg_depth > 0 and self._g_depth == 0
        elif tag == "svg":
            self._svg_depth += 1
        elif tag == "g":
            self._g_depth += 1
            if dict(attrs).get("data-metric") is not None:
                self.marks[dict(attrs)["data-id"] or ""] = dict(attrs)["data-metric"] or ""
        elif tag == "br" and self._cell is not None:
            self._cell.append("\n")

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append("".join(self._cell).strip())
            self._cell = None
        elif tag == "tr" and self._row is not None:
            self.rows.append(self._row)
            self._row = None
        elif tag == "title":
            self._in_title = False
        elif tag == "svg":
            self._svg_depth -= 1
        elif tag == "g":
            self._g_depth -= 1

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)
        if self._in_title and self._title_in_svg:
            self.svg_titles.append(data)
        elif self._in_title and not self._svg_depth:
            self.title += data


def chromium(page: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.glob('chromium-profile-*')))}"
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={profile}", *args, page.as_uri()]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", data[16:24])


@needs_chromium
def test_report_renders_every_candidate_and_keeps_candidate_text_inert(tmp_path):
    repo = study_repo(tmp_path / "r")
    proc = ratchet(repo, "run", "--rounds", "1")  # baseline + one tuned candidate
    assert proc.returncode == 0, proc.stderr
    # 1.4 beats every tuner choice: kept; 1.2 is better still in public but not in the hold-out
    xss_id = submit_and_wait(repo, commit_on_incumbent(repo, "xss", f"{XSS} X=1.4 & <b>bold</b>", "solution.py", with_x("1.4")))
    overfit_id = submit_and_wait(repo, commit_on_incumbent(repo, "overfit", "X=1.2", "solution.py", with_x("1.2")))
    proc = ratchet(repo, "submit", commit_on_incumbent(repo, "cheat", "edit the evaluator", "evaluate.py", 'print("score: 0")\n'))
    assert proc.returncode == 0, proc.stderr
    cheat_id = proc.stdout.strip().splitlines()[-1]

    cands = Ledger(repo / ".ratchet" / "ledger.db").candidates()
    by_id = {c.id: c for c in cands}
    assert by_id[xss_id].status == "keep"
    assert by_id[overfit_id].status == "rejected" and "overfit: hold-out" in by_id[overfit_id].reasons
    assert by_id[cheat_id].status == "rejected"
    tsv_before = (repo / "results.tsv").read_bytes()

    proc = ratchet(repo, "report")
    assert proc.returncode == 0, proc.stderr
    page = repo / ".ratchet" / "report" / "index.html"
    assert "index.html" in proc.stdout and page.is_file()
    assert (repo / "results.tsv").read_bytes() == tsv_before  # the report is a view, nothing else
    raw = page.read_text()
    assert "<script" not in raw.lower()  # escaped at the source, not only by the browser
    assert "&lt;script&gt;document.title=&#x27;pwned&#x27;&lt;/script&gt;" in raw

    dom_text = chromium(page, tmp_path, "--dump-dom").stdout
    dom = Tables()
    dom.feed(dom_text)
    assert dom.title == "ratchet report: demo"  # not 'pwned': the script never ran
    assert dom.scripts == 0
    assert "<b>bold</b>" not in dom_text  # the candidate's markup stayed text too

    # one row per candidate, with its status, metric and (for rejections) the reasons
    rows = {row[0]: row for row in dom.rows if row and row[0] in by_id}
    assert set(rows) == set(by_id)
    header = next(row for row in dom.rows if row[:4] == ["id", "round", "commit", "status"])
    col = {name: i for i, name in enumerate(header)}
    assert col["score"] == 4
    for cand in cands:
        row = rows[cand.id]
        assert row[col["status"]] == cand.status
        assert row[col["commit"]] == (cand.commit_sha or "")[:7]
        if cand.metric is not None:
            assert float(row[col["score"]]) == pytest.approx(cand.metric, rel=1e-5)
    assert f"{XSS} X=1.4 & <b>bold</b>" in rows[xss_id][col["description"]]  # shown as text
    assert "overfit: hold-out score 99" in rows[overfit_id][col["reasons"]]
    assert "touches protected path evaluate.py" in rows[cheat_id][col["reasons"]]
    assert "evaluate" in rows[xss_id][col["phases"]]  # phase durations per candidate

    # counts by status agree with the ledger
    counts = {}
    for cand in cands:
        counts[cand.status] = counts.get(cand.status, 0) + 1
    for status, n in counts.items():
        assert [status, str(n)] in dom.rows

    # the charts are inline SVG (no script, no matplotlib): one point per measured
    # candidate, titled with its id and value
    assert dom.svg_titles[0] == "score over candidates"
    assert {"phase durations per candidate", "score against solution.py:X"} <= set(dom.svg_titles)
    measured = {c.id: c for c in cands if c.metric is not None and c.kind != "incumbent"}
    assert sorted(dom.marks) == sorted(measured)
    for cand_id, value in dom.marks.items():
        assert float(value) == pytest.approx(measured[cand_id].metric)

    # the incumbent and what the study kept, as an escaped diff
    assert "What the study kept" in dom_text
    assert 'class="add">+X = 1.4  # the knob' in dom_text
    assert "job hours" in dom_text

    shot = Path(os.environ.get("RATCHET_REPORT_SCREENSHOT", tmp_path / "report.png"))
    chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1200,2000")
    assert png_size(shot.read_bytes()) == (1200, 2000)


def test_report_needs_no_matplotlib_and_reads_dispatch_json(tmp_path, monkeypatch):
    from ratchet.driver.study import Study
    from ratchet.ui.report import write_report

    repo = study_repo(tmp_path / "r")
    proc = ratchet(repo, "run", "--rounds", "1")
    assert proc.returncode == 0, proc.stderr
    (repo / "dispatch.json").write_text(
        '{"baseline": "torch", "device": "cpu", "versions": {"numpy": "2"}, "buckets": '
        '{"cols=1024 float32": {"impl": "<img src=x onerror=alert(1)>", "speedup": 1.5, "reason": "fastest"}}}'
    )
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib...` now fails
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)

    study = Study(repo)
    try:
        page = write_report(study).read_text()
    finally:
        study.close()
    assert '<svg class="chart"' in page  # the charts are inline SVG, drawn without it
    assert "<img" not in page
    assert "Dispatch table" in page and "dispatch.json in the repository root" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    for cand in Ledger(repo / ".ratchet" / "ledger.db").candidates():
        assert f'<span id="{cand.id}">{cand.id}</span>' in page


# ---------------------------------------------------------------------------------------
# machines, success shares and roofline, on the shared hand-off study (tests/handoff_study.py)


@pytest.fixture(scope="module")
def handoff(tmp_path_factory):
    from handoff_study import handoff_study

    return handoff_study(tmp_path_factory)


def report_rows(repo: Path) -> tuple[Tables, str]:
    proc = ratchet(repo, "report")
    assert proc.returncode == 0, proc.stderr
    raw = (repo / ".ratchet" / "report" / "index.html").read_text()
    dom = Tables()
    dom.feed(raw)
    return dom, raw


def section(raw: str, title: str) -> str:
    start = raw.index(f"<h2>{title}</h2>")
    end = raw.find("<h2>", start + 4)
    return raw[start:end if end > 0 else None]


def test_report_shows_success_shares_by_proposer_and_idea_and_the_roofline(handoff):
    dom, raw = report_rows(handoff.repo)
    by_first = {row[0]: row for row in dom.rows if row}
    # 7 proposals by the agent: 3 kept, 2 discarded, 1 crashed, 1 rejected (with its reason)
    agent = by_first["agent"]
    assert agent[:6] == ["agent", "7", "3 (43%)", "2 (29%)", "1 (14%)", "1 (14%)"]
    assert "rejected: touches protected path evaluate.py ×1" in agent[6]
    assert "crash: evaluate failed: exit code N" in agent[6]
    # and per idea: each queued idea's own outcome; the agent's own attempt apart
    assert by_first["set X to 1.4"][:3] == ["set X to 1.4", "1", "1 (100%)"]
    assert by_first["set X to 5.0"][:4] == ["set X to 5.0", "1", "0 (0%)", "1 (100%)"]
    assert by_first["edit the evaluator"][5] == "1 (100%)"
    assert by_first["(no queued idea)"][:4] == ["(no queued idea)", "1", "0 (0%)", "1 (100%)"]
    assert "By proposer" in raw and "By idea" in raw

    # the evaluator prints roofline_pct = 100 / (1 + 10 score): 3.2% at the start, 81.6% now
    roof = section(raw, "Roofline")
    kept = [handoff.by_idea()[i] for i in ("set X to 2.0", "set X to 1.5", "set X to 1.4")]
    assert f"The incumbent {kept[-1].id} runs at <b>81.6%</b> of the roofline (started at 3.2%)" in roof
    assert "1.22× from the bound" in roof  # 100 / 81.63
    steps = [row for row in dom.rows if row and row[0].split(" ")[0] in {"c0000", *(c.id for c in kept)}
             and len(row) == 5]
    assert [row[2] for row in steps] == ["3.2%", "15.1%", "61.5%", "81.6%"]


def test_report_shows_each_results_machine(handoff):
    """Each result records the machine that measured it (JobResult.fingerprint), shown in the report."""
    from ratchet.job.fingerprint import fingerprint_key, machine_fingerprint, software_key

    dom, raw = report_rows(handoff.repo)
    machines = section(raw, "Machines")
    here = machine_fingerprint()
    assert html_escape(fingerprint_key(here)) in machines
    assert html_escape(software_key(here)) in machines
    measured = [c for c in handoff.ledger() if c.result and c.result.get("fingerprint")]
    assert len(measured) >= 6  # every candidate that ran (the rejected one never ran)
    row = next(r for r in dom.rows if r and r[0] == "M1 (baseline's)")
    assert row[3] == str(len(measured))
    assert "Results from" not in raw  # one machine: nothing flagged


def html_escape(text: str) -> str:
    import html

    return html.escape(text, quote=True)


def test_results_from_other_hardware_are_flagged_not_compared_silently(handoff, tmp_path):
    """A result measured on another machine (say a Ray node with another GPU) is flagged."""
    repo = tmp_path / "copy"
    shutil.copytree(handoff.repo, repo, symlinks=True)
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    cands = ledger.candidates()
    base = {"arch": "x86_64", "cpu": "EPYC 9654", "cores": "192", "gpu": "8x NVIDIA H100 80GB HBM3",
            "gpu_driver": "550.54.15", "python": "3.11.7", "torch": "2.5.1"}
    odd = handoff.by_idea()["set X to 5.0"]
    upgraded = handoff.by_idea()["set X to 1.5"]
    for cand in cands:
        fp = dict(base)
        if cand.id == odd.id:
            fp["gpu"] = "8x NVIDIA A100-SXM4-80GB"
        if cand.id == upgraded.id:
            fp["torch"] = "2.6.0"
        ledger.update(cand.id, result={**(cand.result or {}), "fingerprint": fp})
    ledger.close()

    dom, raw = report_rows(repo)
    assert "Results from 2 different machines" in raw
    assert "8x NVIDIA A100-SXM4-80GB" in raw
    header = next(row for row in dom.rows if row[:4] == ["id", "round", "commit", "status"])
    col = header.index("machine")
    rows = {row[0]: row for row in dom.rows if row and row[0].startswith("c0")}
    assert rows[odd.id][col] == "M2 other hardware than the baseline: not comparable"
    assert rows[upgraded.id][col] == "M1"  # same hardware, other torch: same machine...
    assert "Software versions changed during the study" in section(raw, "Machines")  # ...noted
    machines = [row for row in dom.rows if row and row[0] in ("M1 (baseline's)", "M2")]
    assert sorted((row[0], row[3]) for row in machines) == [
        ("M1 (baseline's)", "1"), ("M1 (baseline's)", str(len(cands) - 2)), ("M2", "1")]


@needs_chromium
def test_new_sections_render_in_a_browser(handoff, tmp_path):
    report_rows(handoff.repo)
    page = handoff.repo / ".ratchet" / "report" / "index.html"
    dom = Tables()
    dom.feed(chromium(page, tmp_path, "--dump-dom").stdout)
    by_first = {row[0]: row for row in dom.rows if row}
    assert by_first["agent"][:3] == ["agent", "7", "3 (43%)"]
    assert "M1 (baseline's)" in by_first


def test_candidate_pages_are_written_once_and_again_only_when_their_rows_changed(tmp_path):
    """A candidate's page is written at its verdict and never again, unless a row it shows
    changed (its own, a confirmation pair, another measurement of its commit): a keep
    elsewhere, which moves the incumbent, writes no earlier candidate's page again."""
    repo = study_repo(tmp_path / "r")
    assert ratchet(repo, "run", "--rounds", "1").returncode == 0
    assert ratchet(repo, "report").returncode == 0
    pages = repo / ".ratchet" / "report" / "c"
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    ids = [c.id for c in ledger.candidates(confirmations=True)]
    seen = ledger.revision()
    ledger.close()
    assert sorted(p.stem for p in pages.glob("*.html")) == sorted(ids)  # one page each
    first = {p.name: p.stat().st_mtime_ns for p in pages.glob("*.html")}
    time.sleep(0.05)
    assert ratchet(repo, "report").returncode == 0
    assert {p.name: p.stat().st_mtime_ns for p in pages.glob("*.html")} == first  # nothing new

    kept = submit_and_wait(repo, commit_on_incumbent(repo, "better", "X=1.4", "solution.py",
                                                     with_x("1.4")))
    assert ratchet(repo, "report").returncode == 0
    now = {p.name: p.stat().st_mtime_ns for p in pages.glob("*.html")}
    assert f"{kept}.html" in now
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    rows = ledger.candidates(confirmations=True)
    ledger.close()

    def changed(cand) -> bool:  # its row, or one measuring the same, written since
        return any(r.rev > seen for r in rows if r.id == cand.id or r.confirms == cand.id
                   or (cand.commit_sha and r.commit_sha == cand.commit_sha))

    again = {f"{c.id}.html" for c in rows if f"{c.id}.html" in first and changed(c)}
    assert {name for name, mtime in first.items() if now[name] != mtime} == again
    assert len(again) < len(first)  # the incumbent moved; the discarded pages stayed
    page = (pages / f"{kept}.html").read_text()
    assert "Diff against its parent" in page and 'class="add">+X = 1.4' in page
    # nothing on it moves with the incumbent later: the overview says what was kept since
    against = page.split("<h2>Diff against the incumbent</h2>")[1].split("<h2>")[0]
    assert 'id="against-incumbent"' in against and "<pre" not in against
