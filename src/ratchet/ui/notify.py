"""`[notify]`: tell someone what an overnight study did, as it happens.

Notices go out on a keep, on a streak of crashes, when the study ends, and when a budget
stops it. Each is one line of summary (with the pooled estimates, as the end-of-run line
says them) and a small JSON object, sent to the user's command (`/bin/sh -c`, the line in
$RATCHET_SUMMARY, the JSON on stdin) and/or POSTed to a URL (`{"text": ...}`, which
Slack-style incoming webhooks take as is). The URL may come from an environment
variable (`url_env`), so a webhook's secret need not be committed with ratchet.toml.

Deliveries run on one thread of their own, in order, each under `timeout`: a slow or dead
receiver never holds up the study, and a failure is logged (one line, and a ledger event)
and never raised. Notices are driven from the ledger: the verdicts that are new since the
last look, so a resumed study does not repeat what it said before it stopped.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ratchet.core.config import Notify
from ratchet.core.vocab import Kind, Status
from ratchet.driver import views, words
from ratchet.driver.tally import Tally
from ratchet.store.ledger import Ledger

if TYPE_CHECKING:
    from ratchet.driver.study import Study

STOP = object()  # tells the delivery thread to finish


class Event(StrEnum):
    KEEP = "keep"
    CRASH = "crash"  # `crash_streak` crashes in a row
    END = "end"
    BUDGET = "budget"  # the study stopped because a budget was spent


@dataclass(frozen=True)
class Notice:
    event: Event
    summary: str
    data: dict[str, Any] = field(default_factory=dict)

    def payload(self) -> dict[str, Any]:
        return {"event": self.event.value, "text": self.summary, **self.data}


class Notifier:
    """Watches a study's ledger and sends `[notify]`'s notices; inert without settings.
    A study's watcher (driver/study.py's `Watcher`), handed in by the front (`watcher`)."""

    name = "notify"  # its warnings' label

    def __init__(self, settings: Notify | None, study: str, metric: str, goal: str,
                 log: Callable[[str], None] = lambda _m: None) -> None:
        self.settings = settings
        self.study, self.metric, self.goal = study, metric, goal
        self.log = log
        self.seen: set[str] = set()
        self.streak = 0
        self.failures: queue.Queue[str] = queue.Queue()
        self.outbox: queue.Queue[Any] = queue.Queue()
        self.first_event = 0
        self.budget_before: Any = None
        self.thread: threading.Thread | None = None
        self.sent: list[Notice] = []  # what was handed over, in order (for `ratchet status`)

    @property
    def active(self) -> bool:
        return self.settings is not None

    def start(self, ledger: Ledger) -> None:
        """Remember what is already judged (a resume says nothing of it) and start the
        delivery thread."""
        if not self.active:
            return
        self.seen = set(ledger.verdicts())
        self.first_event = ledger.db.execute("SELECT COALESCE(MAX(id), 0) FROM events").fetchone()[0]
        self.budget_before = ledger.study().budget_stop
        self.thread = threading.Thread(target=self._deliver_all, name="ratchet-notify", daemon=True)
        self.thread.start()

    # -- what happened --------------------------------------------------------------------

    def check(self, ledger: Ledger) -> None:
        """Notices for the verdicts made since the last look; log failed deliveries."""
        self._drain_failures(ledger)
        if not self.active or self.thread is None:
            return
        fresh = [c for c in ledger.candidates() if c.is_judged and c.id not in self.seen]
        for cand in fresh:  # in the ledger's order
            self.seen.add(cand.id)
            if cand.kind != Kind.CANDIDATE:
                continue
            if cand.status == Status.KEEP:
                self.streak = 0
                head = views.headline(ledger, self.metric, self.goal)
                change = f", {head.change * 100:+.1f}% vs baseline" if head.change is not None else ""
                inc = head.incumbent.text() if head.incumbent else views.fmt(cand.metric)
                self._send(Notice(Event.KEEP, f"ratchet {self.study}: keep {cand.id} "
                                  f"{self.metric} {inc}{change}: {cand.description}",
                                  {"candidate": cand.id, "commit": cand.commit_sha,
                                   "metric": cand.metric, "headline": head.as_dict()}))
            elif cand.status == Status.CRASH:
                self.streak += 1
                if self.streak == self.settings.crash_streak:  # type: ignore[union-attr]
                    what = (f"{self.streak} crashes in a row, the last" if self.streak > 1
                            else "crash")
                    self._send(Notice(Event.CRASH, f"ratchet {self.study}: {what} {cand.id}: "
                                      f"{words.gist(cand.reasons or '', 200)}",
                                      {"candidate": cand.id, "streak": self.streak,
                                       "reasons": cand.reasons}))
            else:
                self.streak = 0

    def end(self, ledger: Ledger, why: str) -> None:
        """The study ended (`why`: finished, stopped, failed: ...): one notice, then a
        bounded wait for the deliveries still queued."""
        if not self.active or self.thread is None:
            return
        self.check(ledger)
        # a budget stop in this run: the meta record the budget writes when a limit stops
        # the study (`budget_stop`, with its one line), or a `budget...` event
        stop = ledger.study().budget_stop
        if stop is not None and stop != self.budget_before:
            budget: dict[str, Any] | None = {"kind": (stop.get("line") if isinstance(stop, dict)
                                                     else None) or str(stop)}
        else:
            row = ledger.db.execute(
                "SELECT kind, data FROM events WHERE id > ? AND kind LIKE 'budget%' "
                "ORDER BY id DESC LIMIT 1", (self.first_event,)).fetchone()
            budget = {"kind": row["kind"]} if row is not None else None
        counts = ledger.status_counts()
        head = views.headline(ledger, self.metric, self.goal)
        line = head.line() or "no incumbent measured"
        tally = Tally.of(ledger)  # the end line's count, in its words
        told = tally.line()
        data = {"why": why, "counts": counts, "tally": tally.as_dict(),
                "headline": head.as_dict(), "incumbent_id": head.incumbent_id}
        if budget is not None:
            self._send(Notice(Event.BUDGET, f"ratchet {self.study}: stopped by its budget "
                              f"({budget['kind']}); {line}", {**data, "budget": budget["kind"]}))
        self._send(Notice(Event.END, f"ratchet {self.study}: {why}; {told}; {line}", data))
        self.close()
        self._drain_failures(ledger)

    def close(self, wait_s: float | None = None) -> None:
        if self.thread is None:
            return
        self.outbox.put(STOP)
        limit = wait_s if wait_s is not None else 2 * self._timeout() + 1
        self.thread.join(limit)
        self.thread = None

    # -- delivery -----------------------------------------------------------------------

    def _timeout(self) -> float:
        return self.settings.timeout if self.settings else 10.0

    def _send(self, notice: Notice) -> None:
        assert self.settings is not None
        if notice.event.value not in self.settings.on:
            return
        self.sent.append(notice)
        self.outbox.put(notice)

    def _deliver_all(self) -> None:
        while True:
            notice = self.outbox.get()
            if notice is STOP:
                return
            for problem in deliver(self.settings, self.study, notice):  # type: ignore[arg-type]
                self.failures.put(problem)

    def _drain_failures(self, ledger: Ledger) -> None:
        while True:
            try:
                problem = self.failures.get_nowait()
            except queue.Empty:
                return
            self.log(f"warning: notify: {problem} (the study goes on)")
            with contextlib.suppress(sqlite3.Error):  # a notice never breaks the study
                ledger.event("notify-failed", None, problem=problem)


def watcher(study: Study) -> Notifier:
    """`[notify]`'s notifier of `study`, as the fronts hand it in: `Study(watch=[watcher])`
    (cli.py, `ratchet mcp`); the loop itself never imports the views."""
    return Notifier(study.config.notify, study.name, study.config.metric.name,
                    study.config.metric.goal, study.log)


def deliver(settings: Notify, study: str, notice: Notice) -> list[str]:
    """Send one notice everywhere `settings` names; the problems, never an exception."""
    problems = []
    if settings.command:
        problems += _run_command(settings.command, study, notice, settings.timeout)
    url = settings.url or (os.environ.get(settings.url_env) if settings.url_env else None)
    if settings.url_env and not settings.url and not url:
        problems.append(f"notify.url_env: ${settings.url_env} is not set; nothing posted")
    if url:
        problems += _post(url, notice, settings.timeout)
    return problems


def _run_command(command: str, study: str, notice: Notice, timeout: float) -> list[str]:
    env = {**os.environ, "RATCHET_EVENT": notice.event.value, "RATCHET_SUMMARY": notice.summary,
           "RATCHET_STUDY": study, "RATCHET_CANDIDATE": str(notice.data.get("candidate") or "")}
    try:
        proc = subprocess.run(["/bin/sh", "-c", command], input=json.dumps(notice.payload(), default=str),
                              capture_output=True, text=True, timeout=timeout, env=env,
                              start_new_session=True)  # a Ctrl-C for the study is not its
    except subprocess.TimeoutExpired:
        return [f"notify.command ran past {timeout:g} s and was stopped"]
    except OSError as exc:
        return [f"notify.command could not start: {exc}"]
    if proc.returncode != 0:
        tail = " ".join((proc.stderr or proc.stdout).split())[-200:]
        return [f"notify.command exited {proc.returncode}" + (f": {tail}" if tail else "")]
    return []


def _post(url: str, notice: Notice, timeout: float) -> list[str]:
    where = urlsplit(url)
    name = f"{where.scheme}://{where.hostname}"  # never the path: a webhook's secret lives there
    if where.scheme not in ("http", "https") or not where.hostname:
        return [f"notify: {name or 'the URL'} is not an http(s) URL"]
    import urllib.error  # here: ssl and http.client are a part of every CLI start else
    import urllib.request

    body = json.dumps(notice.payload(), default=str).encode()
    request = urllib.request.Request(url, data=body, method="POST", headers={
        "Content-Type": "application/json", "User-Agent": "ratchet-notify"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:  # noqa: S310 - http(s) only
            reply.read(4096)
    except urllib.error.HTTPError as exc:
        return [f"notify: {name} answered HTTP {exc.code}"]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        return [f"notify: posting to {name} failed after {time.monotonic() - started:.1f} s: {reason}"]
    return []
