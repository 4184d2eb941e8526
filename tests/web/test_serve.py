"""`ratchet serve`: a real study, the real CLI serving it, pages loaded in a real headless
Chromium (tests/web/browser.py) and checked as a user would read them.

- the overview's headline cards are the ledger's pooled estimates (views.headline);
- a page left open follows a `ratchet run` running in another process (no reload);
- a candidate's page shows its verdict with every reason, its diffs and its log tail;
- candidate text (a commit subject, a log) holding `<script>` stays text, in the live
  page and in the static report's files alike;
- serving never changes the ledger's bytes; only GET is answered;
- every page needs the token, on loopback too (the printed address carries it); a bind
  other than loopback needs one given; on loopback a foreign Host is refused.

Screenshots of each page go to $RATCHET_DASHBOARD_SCREENSHOTS (docs/dashboard/ holds
the ones docs/watching.md shows), else to the test's temporary folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sqlite3
import subprocess
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from helpers import RATCHET, ROOT, SCORE_SOLUTION, config_text, git, make_repo, ratchet

from ratchet.driver import views
from ratchet.driver.tally import Tally
from ratchet.store.ledger import Ledger
from web.browser import Browser, needs_chromium

# The evaluator takes a moment, so a running job can be seen on the page: its phase passes
# the worker, the driver's poll, the ledger and the page's 0.5 s stream before it shows, and
# on a loaded machine a 0.6 s phase could pass unseen.
EVALUATOR = '''
import time
import solution
time.sleep(2.0)
print("correct: true")
print(f"score: {solution.score():.6f}")
'''

SOLUTION = SCORE_SOLUTION  # the knob X, as every score study of the suite

# a candidate's own words and output, hostile: they must stay text
XSS_SUBJECT = "<script>window.pwned=1</script> X=1.4 <img src=x onerror=\"window.pwned=2\">"
XSS_PRINT = '<script>window.pwned=3</script><img src=x onerror="window.pwned=4">'
XSS_IDEA = "<script>window.pwned=5</script>try <b>1.4</b>"
XSS_SOLUTION = SOLUTION.replace("X = 3.0", "X = 1.4") + f"\nprint({XSS_PRINT!r})\n"

TASK = textwrap.dedent('''
    [task]
    name = "live"
    editable = ["solution.py"]
    protected = ["evaluate.py"]
    evaluate = "python evaluate.py"
    timeout = "60s"
''')


def shots_dir(tmp_path: Path) -> Path:
    return Path(os.environ.get("RATCHET_DASHBOARD_SCREENSHOTS") or tmp_path / "shots")


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> Path:
    """One round of a tuned study, then a hand-made candidate whose words are hostile."""
    repo = make_repo(tmp_path_factory.mktemp("serve") / "repo", {
        "ratchet.toml": config_text(task=TASK), "evaluate.py": EVALUATOR,
        "solution.py": SOLUTION})
    ratchet(repo, "run", "--rounds", "1", check=True)
    git(repo, "checkout", "-q", "-B", "xss", "ratchet/live")
    (repo / "solution.py").write_text(textwrap.dedent(XSS_SOLUTION).lstrip("\n"))
    git(repo, "commit", "-qam", XSS_SUBJECT)
    git(repo, "checkout", "-q", "main")
    cand_id = ratchet(repo, "submit", "xss", check=True).stdout.strip().splitlines()[-1]
    ratchet(repo, "wait", cand_id, check=True)
    # the queued idea it came from, as `ratchet idea` would have recorded it
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    ledger.update(cand_id, idea=XSS_IDEA)
    ledger.close()
    return repo


@contextmanager
def serving(repo: Path, *args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`ratchet serve` on a free loopback port; yields the address it printed."""
    proc = subprocess.Popen([*RATCHET, "serve", "--repo", str(repo), "--port", "0", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT / "src"), **(env or {})})
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"serving (http://\S+)", line)
        assert match, f"no address printed: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        yield match.group(1)
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def ledger_of(repo: Path) -> Ledger:
    return Ledger.readonly(repo / ".ratchet" / "ledger.db")


def headline(repo: Path) -> views.Headline:
    ledger = ledger_of(repo)
    try:
        return views.headline(ledger, "score", "minimize")
    finally:
        ledger.close()


def card(browser: Browser, name: str) -> str:
    return browser.eval(f"document.querySelector('[data-card=\"{name}\"] .v').textContent")


def fetch(url: str, headers: dict[str, str] | None = None, method: str = "GET"
          ) -> tuple[int, dict[str, str], str]:
    request = urllib.request.Request(url, headers=headers or {}, method=method)

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):  # noqa: ANN002, ANN003
            return None

    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(request, timeout=20) as reply:
            return reply.status, dict(reply.headers), reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read().decode()


def base_of(url: str) -> str:
    return url.split("?", 1)[0]


def at(url: str, page: str = "") -> str:
    """Another page at the printed address, with its token (the server moves the token
    into a cookie and sends the browser on to the page)."""
    base, _, query = url.partition("?")
    return f"{base}{page}?{query}"


def bearer(url: str) -> dict[str, str]:
    """The printed address's token as a script would send it."""
    token = urllib.parse.parse_qs(url.partition("?")[2])["token"][0]
    return {"Authorization": f"Bearer {token}"}


# ---------------------------------------------------------------------------------------


@needs_chromium
def test_candidate_page_shows_verdict_reasons_diffs_and_keeps_hostile_text_inert(study, tmp_path):
    ledger = ledger_of(study)
    cands = ledger.candidates()
    xss = next(c for c in cands if c.proposer == "submit")
    ledger.close()
    assert xss.status == "keep", xss.reasons
    assert "<script>" in xss.description  # recorded as written (escaping is the view's job)
    with serving(study) as url, Browser(tmp_path / "profile") as browser:
        browser.goto(at(url, f"c/{xss.id}"))
        assert browser.eval("document.title") == f"{xss.id}: live"  # no script retitled it
        assert browser.eval("document.getElementById('description').textContent") == xss.description
        reasons = browser.eval("Array.from(document.querySelectorAll('#verdict li'))"
                               ".map(li => li.textContent)")
        assert reasons == [r for r in re.split(r";\s+", xss.reasons or "") if r]
        assert any("confirmed" in r for r in reasons)  # the keep's own evidence, in full
        diffs = browser.eval("Array.from(document.querySelectorAll('pre.diff'))"
                             ".map(p => p.textContent)")
        assert any("+X = 1.4  # the knob" in d and "-X = " in d for d in diffs)
        log = browser.eval("document.querySelector('pre.log[data-phase=\"evaluate\"]').textContent")
        assert XSS_PRINT in log and "score: 0.022500" in log  # the log tail, as text
        idea = browser.eval("Array.from(document.querySelectorAll('table.kv tr'))"
                            ".find(r => r.cells[0].textContent === 'idea').cells[1].textContent")
        assert idea == XSS_IDEA
        # no markup of theirs became an element
        assert not browser.eval("Array.from(document.querySelectorAll('b'))"
                                ".some(b => b.textContent === '1.4')")
        # only the server's own script exists, and nothing the candidate wrote ran
        assert browser.eval("document.scripts.length") == 1
        assert browser.eval("typeof window.pwned") == "undefined"
        assert browser.eval("document.querySelectorAll('img').length") == 0
        browser.screenshot(shots_dir(tmp_path) / "candidate.png")
        for page in ("", "candidates"):
            browser.goto(at(url, page))
            assert browser.eval("typeof window.pwned") == "undefined"
            assert browser.eval("document.scripts.length") == 1
            assert xss.description in browser.eval("document.body.textContent")
        # side by side with the baseline: its words in the table and the pickers stay text
        base = next(c for c in cands if c.kind == "baseline")
        browser.goto(f"{base_of(url)}compare?a={base.id}&b={xss.id}")
        assert browser.eval("typeof window.pwned") == "undefined"
        assert browser.eval("document.scripts.length") == 1
        assert browser.eval("document.querySelectorAll('img').length") == 0
        assert xss.description in browser.eval(
            "Array.from(document.querySelectorAll('#compare-numbers tbody tr')).find(r =>"
            " r.cells[0].textContent === 'description').cells[2].textContent")

    # the static report: the same views, written as files, with no script at all
    assert ratchet(study, "report").returncode == 0
    for page in (study / ".ratchet" / "report" / "index.html",
                 study / ".ratchet" / "report" / "c" / f"{xss.id}.html"):
        assert "<script" not in page.read_text().lower()
        with Browser(tmp_path / "profile-report") as browser:
            browser.goto(page.as_uri())
            assert browser.eval("typeof window.pwned") == "undefined"
            assert browser.eval("document.scripts.length") == 0
            assert xss.description in browser.eval("document.body.textContent")


def hold_in_phase(study: Path, phase: str, timeout: float) -> list[psutil.Process]:
    """Stop (SIGSTOP) the evaluator processes of the first job its worker says is in
    `phase` (the local backend's state.json; pid.json names the worker), as a slow
    evaluation would hold them there; returns them, to be resumed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for state in (study / ".ratchet" / "jobs").glob("*/state.json"):
            try:
                if json.loads(state.read_text()).get("phase") != phase:
                    continue
                worker = psutil.Process(json.loads((state.parent / "pid.json").read_text())["pid"])
                procs = [p for p in worker.children(recursive=True)
                         if "evaluate.py" in " ".join(p.cmdline())]
            except (OSError, ValueError, KeyError, psutil.Error):
                continue  # written meanwhile, or the job just ended
            for proc in procs:
                with contextlib.suppress(psutil.Error):
                    proc.suspend()
            if procs:
                return procs
        time.sleep(0.02)
    raise AssertionError(f"no job reached its {phase} phase in {timeout:.0f} s")


def digest(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else None


@needs_chromium
def test_serving_never_writes_the_ledger(study, tmp_path):
    db = study / ".ratchet" / "ledger.db"
    wal = db.with_name("ledger.db-wal")
    before = (digest(db), digest(wal), wal.stat().st_size if wal.exists() else 0)
    files_before = sorted(p.name for p in (study / ".ratchet").iterdir())
    ids = [c.id for c in ledger_of(study).candidates(confirmations=True)]
    with serving(study) as url, Browser(tmp_path / "profile") as browser:
        for page in ["", "candidates", *(f"c/{i}" for i in ids)]:
            browser.goto(at(url, page))
            assert browser.eval("document.querySelector('main#live').children.length") > 0
        browser.wait_for("document.getElementById('live-state').textContent.startsWith('live')")
        status, _, _ = fetch(base_of(url), method="POST")
        assert status == 405  # read-only: nothing but GET and HEAD
        status, _, body = fetch(base_of(url) + "api/summary", bearer(url))
        assert status == 200 and '"headline"' in body
    after = (digest(db), digest(wal), wal.stat().st_size if wal.exists() else 0)
    # the ledger's bytes are unchanged; a WAL that was not there may exist now, empty
    assert after[0] == before[0]
    assert after[1] == before[1] or (before[1] is None and after[2] == 0)
    files_after = sorted(p.name for p in (study / ".ratchet").iterdir())
    assert set(files_after) - set(files_before) <= {"ledger.db-wal", "ledger.db-shm"}

    readonly = Ledger.readonly(db)  # the connection serve uses refuses writes itself
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        readonly.db.execute("UPDATE meta SET value = '0' WHERE key = 'round'")
    readonly.close()


def test_a_bind_beyond_loopback_needs_a_token(study):
    proc = ratchet(study, "serve", "--host", "0.0.0.0", "--port", "0", timeout=60)
    assert proc.returncode == 2
    assert "--token" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = ratchet(study, "serve", "--host", "0.0.0.0", "--port", "0", "--token", "short",
                   timeout=60)
    assert proc.returncode == 2 and "too short" in proc.stderr

    token = "t0ken-" + "x" * 20
    with serving(study, "--host", "0.0.0.0", env={"RATCHET_SERVE_TOKEN": token}) as url:
        assert f"?token={token}" in url
        base = base_of(url).replace("0.0.0.0", "127.0.0.1")
        status, _, body = fetch(base)
        assert status == 401 and "token is required" in body
        assert fetch(base + "?token=wrong-" + "y" * 20)[0] == 401
        status, headers, _ = fetch(f"{base}candidates?token={token}")
        assert status == 303 and headers["Location"] == "/candidates"
        cookie = headers["Set-Cookie"].split(";")[0]
        assert "HttpOnly" in headers["Set-Cookie"] and "SameSite=Strict" in headers["Set-Cookie"]
        assert fetch(base + "candidates", {"Cookie": cookie})[0] == 200
        assert fetch(base + "api/summary", {"Authorization": f"Bearer {token}"})[0] == 200

    with serving(study) as url:  # loopback: a page from another site cannot read it
        status, _, body = fetch(url, {"Host": "evil.example:80"})
        assert status == 403 and "127.0.0.1 or localhost" in body
        # nor a process of this machine without the printed address's token
        assert "?token=" in url
        for page in ("", "api/summary", "candidates"):
            status, _, body = fetch(base_of(url) + page)
            assert status == 401 and "token is required" in body and "score" not in body
        status, headers, body = fetch(base_of(url), bearer(url))
        assert status == 200 and "nonce-" in headers["Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"


@needs_chromium
def test_the_open_page_follows_a_running_study(study, tmp_path):
    """Last in this file: it runs another round of the shared study."""
    shots = shots_dir(tmp_path)
    before = headline(study)
    n_before = Tally.of(ledger_of(study)).candidates  # as the end line counts (tally.py)
    with serving(study) as url, Browser(tmp_path / "profile") as browser:
        browser.goto(url)
        browser.wait_for("document.getElementById('live-state').textContent.startsWith('live')")
        # what the cards say is the ledger's pooled estimate, not one re-measure
        assert card(browser, "incumbent") == before.incumbent.text()
        assert card(browser, "baseline") == before.baseline.text()
        assert card(browser, "candidates") == str(n_before)
        browser.eval("window.stillThisPage = 42")

        ledger = ledger_of(study)
        rounds = views.rounds_done(ledger.get("round"), ledger.candidates()) + 1  # one more
        ledger.close()
        run = subprocess.Popen([*RATCHET, "run", "--rounds", str(rounds), "--repo", str(study)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        try:
            # a job of the new round, held in its evaluate phase until the page shows it
            # running there, on its slot: the page must follow the phase however long
            # the machine's load delays its update (a 2 s phase could pass unseen)
            held = hold_in_phase(study, "evaluate", timeout=120)
            try:
                phase, slot = browser.wait_for(
                    "(() => { const r = Array.from(document.querySelectorAll('#running tbody tr'))"
                    ".find(r => r.cells[2].textContent === 'evaluate');"
                    " return r && [r.cells[2].textContent, r.cells[5].textContent]; })()",
                    timeout=60, interval=0.05)
                assert phase == "evaluate" and re.fullmatch(r"cpu\d+", slot), (phase, slot)
                assert all(p.status() == psutil.STATUS_STOPPED for p in held)  # still held
                browser.screenshot(shots / "overview-running.png")
            finally:
                for proc in held:
                    with contextlib.suppress(psutil.Error):
                        proc.resume()
            out, err = run.communicate(timeout=180)
        finally:
            if run.poll() is None:
                run.kill()
        assert run.returncode == 0, err
        after = headline(study)
        n_after = Tally.of(ledger_of(study)).candidates
        assert n_after > n_before
        browser.wait_for(f"document.querySelector('[data-card=\"candidates\"] .v').textContent"
                         f" === '{n_after}'", timeout=20)
        browser.wait_for("document.getElementById('running-none') !== null", timeout=20)
        assert card(browser, "incumbent") == after.incumbent.text()
        assert browser.eval("window.stillThisPage") == 42  # updated in place, not reloaded
        marks = browser.eval("Array.from(document.querySelectorAll('svg.chart g.mark[data-metric]'))"
                             ".map(g => g.dataset.id)")
        measured = [c.id for c in ledger_of(study).candidates() if c.metric is not None
                    and c.kind != "incumbent"]
        assert sorted(marks) == sorted(measured)  # one point per measured candidate
        browser.screenshot(shots / "overview.png")

        browser.goto(at(url, "candidates"))
        rows = browser.eval("document.querySelectorAll('#candidates tbody tr').length")
        assert rows == len(ledger_of(study).candidates())  # the baseline's row too
        # sort by the metric (a click on its header), then filter to the keeps
        browser.eval("Array.from(document.querySelectorAll('#candidates th'))"
                     ".find(th => th.textContent === 'score').click()")
        values = browser.eval("Array.from(document.querySelectorAll('#candidates tbody tr'))"
                              ".map(r => r.cells[4].textContent).filter(v => v !== '')"
                              ".map(Number)")
        assert values == sorted(values) and len(values) >= 3
        browser.eval("(() => { const s = document.getElementById('filter-status');"
                     " s.value = 'keep'; s.dispatchEvent(new Event('input')); })()")
        shown = browser.eval("Array.from(document.querySelectorAll('#candidates tbody tr'))"
                             ".filter(r => !r.hidden).map(r => r.cells[3].textContent)")
        keeps = [c for c in ledger_of(study).candidates() if c.status == "keep"]
        assert shown == ["keep"] * len(keeps)
        browser.screenshot(shots / "candidates.png")
