"""`[notify]`: real studies through `ratchet run`, notices to a real local command and a
real loopback HTTP receiver. What a user checks: a notice per keep (naming the kept
candidate, with the pooled numbers), one for a streak of crashes, one at the end with
the end-of-run line; and that a dead or failing receiver costs a warning, never the study.
"""

from __future__ import annotations

import http.server
import json
import textwrap
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import SCORE_SOLUTION, config_text, make_repo, ratchet

from ratchet.driver import views, words
from ratchet.store.ledger import Ledger

EVALUATOR = '''
import solution
print("correct: true")
print(f"score: {solution.score():.6f}")
'''

# crashes for every X but the start's: each tuned candidate crashes
CRASHING_EVALUATOR = '''
import sys
import solution
if solution.X != 3.0:
    sys.exit("boom: X is not 3.0")
print("correct: true")
print(f"score: {solution.score():.6f}")
'''

SOLUTION = SCORE_SOLUTION  # the knob X, as every score study of the suite


class Receiver(http.server.ThreadingHTTPServer):
    """A webhook endpoint on loopback: records every POST; can answer late or fail."""

    daemon_threads = True

    def __init__(self, status: int = 200, delay_s: float = 0.0) -> None:
        self.posts: list[dict] = []
        self.paths: list[str] = []
        self.status, self.delay_s = status, delay_s
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.paths.append(self.path)
                receiver.posts.append(json.loads(body))
                time.sleep(receiver.delay_s)
                self.send_response(receiver.status)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

        super().__init__(("127.0.0.1", 0), Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextmanager
def receiving(**kwargs: float) -> Iterator[Receiver]:
    server = Receiver(**kwargs)  # type: ignore[arg-type]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def study_with(path: Path, notify: str, evaluator: str = EVALUATOR, **sections: str) -> Path:
    return make_repo(path, {
        "ratchet.toml": config_text(**sections) + "\n" + textwrap.dedent(notify),
        "evaluate.py": evaluator, "solution.py": SOLUTION})


def command_log(log: Path) -> str:
    """A notify command that appends the event, the summary and the JSON it was given."""
    return (f'printf "%s\\\\t%s\\\\t" "$RATCHET_EVENT" "$RATCHET_SUMMARY" >> {log}; '
            f"cat >> {log}; echo >> {log}")


def read_command_log(log: Path) -> list[tuple[str, str, dict]]:
    out = []
    for line in log.read_text().splitlines():
        event, summary, payload = line.split("\t", 2)
        out.append((event, summary, json.loads(payload)))
    return out


def test_keeps_and_the_end_reach_a_command_and_a_webhook(tmp_path):
    log = tmp_path / "notices.log"
    with receiving() as hook:
        repo = study_with(tmp_path / "r", f'''
            [notify]
            url = "{hook.url}/hooks/abc"
            command = '{command_log(log)}'
        ''', search='[search]\nproposer = "tune"\nparallel = 3\nrounds = 1\n')
        proc = ratchet(repo, "run")
        assert proc.returncode == 0, proc.stderr
        assert "notify" not in proc.stderr  # nothing failed
        posts = list(hook.posts)
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    keeps = [c for c in ledger.candidates() if c.kind == "candidate" and c.status == "keep"]
    head = views.headline(ledger, "score", "minimize")
    ledger.close()
    assert keeps, "the tuner found no improvement: the test's knob choices are wrong"

    # the webhook: one notice per keep, naming it, then the end with the run's headline
    assert [p["event"] for p in posts] == ["keep"] * len(keeps) + ["end"]
    assert [p["candidate"] for p in posts[:-1]] == [c.id for c in keeps]
    for post, cand in zip(posts, keeps, strict=False):
        assert post["text"].startswith(f"ratchet demo: keep {cand.id} score ")
        assert cand.description in post["text"]
    end = posts[-1]
    assert end["text"].startswith("ratchet demo: finished; ")
    assert head.line() in end["text"]  # the pooled numbers, as the end-of-run line says them
    assert end["headline"]["incumbent"]["mean"] == head.incumbent.mean
    assert hook.paths == ["/hooks/abc"] * len(posts)

    # the command got the same notices, in the same order, with the summary in its env
    told = read_command_log(log)
    assert [(e, s) for e, s, _ in told] == [(p["event"], p["text"]) for p in posts]
    assert [payload for _, _, payload in told] == posts


def test_a_crash_streak_is_one_notice(tmp_path):
    log = tmp_path / "notices.log"
    repo = study_with(tmp_path / "r", f'''
        [notify]
        command = '{command_log(log)}'
        on = ["crash", "end"]
        crash_streak = 3
    ''', evaluator=CRASHING_EVALUATOR,
        search='[search]\nproposer = "tune"\nparallel = 2\nrounds = 2\n',
        knobs='[tune.knobs]\n"solution.py:X" = { choices = [2.0, 1.5, 1.0, 0.0] }\n')
    proc = ratchet(repo, "run")
    assert proc.returncode == 0, proc.stderr
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    crashed = [c for c in ledger.candidates() if c.status == "crash"]
    ledger.close()
    assert len(crashed) >= 3
    told = read_command_log(log)
    assert [e for e, _, _ in told] == ["crash", "end"]  # one notice for the streak, not each
    assert told[0][1].startswith(f"ratchet demo: 3 crashes in a row, the last {crashed[2].id}: ")
    # its reasons, cut keeping the exception at their end (words.gist)
    assert told[0][1].endswith(words.gist(crashed[2].reasons or "", 200))
    assert told[0][2]["streak"] == 3
    assert f", {len(crashed)} crashed" in told[1][1]  # the end line's count (tally.py)


def test_failing_receivers_cost_a_warning_never_the_study(tmp_path):
    with receiving(status=500, delay_s=0.0) as failing, receiving(delay_s=3.0) as slow:
        repo = study_with(tmp_path / "r", f'''
            [notify]
            url = "{failing.url}/secret-path-token"
            command = "echo cannot deliver >&2; exit 3"
            on = ["end"]
        ''', search='[search]\nproposer = "tune"\nparallel = 2\nrounds = 1\n')
        proc = ratchet(repo, "run")
        assert proc.returncode == 0, proc.stderr
        assert f"warning: notify: notify: {failing.url.rsplit(':', 1)[0]} answered HTTP 500" in proc.stderr
        assert "warning: notify: notify.command exited 3: cannot deliver" in proc.stderr
        assert "secret-path-token" not in proc.stderr  # a webhook's secret is never printed
        assert "study demo:" in proc.stdout  # the end-of-run summary, as without [notify]

        repo = study_with(tmp_path / "r2", f'''
            [notify]
            url = "{slow.url}/hook"
            on = ["end"]
            timeout = "1s"
        ''', search='[search]\nproposer = "tune"\nparallel = 2\nrounds = 1\n')
        started = time.monotonic()
        proc = ratchet(repo, "run")
        assert proc.returncode == 0, proc.stderr
        assert "failed after 1." in proc.stderr and "timed out" in proc.stderr
        assert time.monotonic() - started < 60
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    failures = [json.loads(e["data"]) for e in ledger.events() if e["kind"] == "notify-failed"]
    ledger.close()
    assert len(failures) == 1 and "timed out" in failures[0]["problem"]


def test_a_bad_notify_section_is_one_line_naming_the_key(tmp_path):
    repo = study_with(tmp_path / "r", '''
        [notify]
        url = "ftp://example.invalid/x"
    ''')
    proc = ratchet(repo, "run", "--rounds", "1")
    assert proc.returncode == 2
    assert "notify.url: must be an http:// or https:// URL with a host" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert not (repo / ".ratchet" / "ledger.db").exists() or "Traceback" not in proc.stderr


def test_the_docs_notify_example_is_a_valid_section():
    import re

    from helpers import ROOT

    from ratchet.core.config import Notify

    text = (ROOT / "docs" / "watching.md").read_text()
    (block,) = [b for b in re.findall(r"^```toml\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
                if b.startswith("[notify]")]
    import tomllib

    settings = Notify.model_validate(tomllib.loads(block)["notify"])
    assert settings.url_env == "SLACK_WEBHOOK" and settings.crash_streak == 3
