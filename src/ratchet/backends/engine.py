"""Driver-side pieces shared by the Ray and shell backends (engines we do not own).

Engines retry nothing and can keep a job queued forever, so ratchet owns the deadlines
and the bookkeeping: one small JSON record per job under .ratchet/<backend>/jobs/ holds
the engine's id, when the job was placed, when we first saw it run, and why we stopped
it (queue timeout, deadline, cancel). A restarted driver reads these records and
reattaches; nothing here depends on the driver's memory.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

from ratchet.backends import BackendError
from ratchet.core.vocab import JobState, Outcome
from ratchet.job.jobspec import JobResult
from ratchet.job.seal import KeyStore

log = logging.getLogger("ratchet.backends")
T = TypeVar("T")

# a job's whole life may exceed task.timeout by this much (snapshot unpacking, imports,
# the worker's own kill grace) before ratchet stops it from outside
DEADLINE_GRACE_S = 60.0


def engine_call(call: Callable[[], T], what: str, *,
                transient: tuple[type[BaseException], ...], note: Callable[[str], None]) -> T:
    """One engine call, tried once: a transient failure is noted and becomes BackendError.

    Retries have one owner: the study (`ratchet.driver.jobs.Jobs.call`) retries a failed backend
    call with backoff and reports it. Retrying here as well multiplied the calls (up to
    48 for one Ray submit).
    """
    try:
        return call()
    except transient as exc:
        note(f"{what} failed ({type(exc).__name__}: {str(exc)[:200]})")
        raise BackendError(f"{what}: {type(exc).__name__}: {exc}") from exc


@dataclass
class JobRecord:
    job_id: str
    engine_id: str | None = None
    submitted_at: float = 0.0
    running_at: float | None = None  # first time we saw it run (engine time if known)
    stop_reason: str | None = None  # set before we stop a job ourselves
    stop_outcome: Outcome = Outcome.TIMEOUT  # the outcome a job we stopped is reported with
    timeout_s: float = 0.0
    lost: str | None = None  # why the job was judged lost (for the logs)


class RecordStore:
    def __init__(self, root: Path) -> None:
        self.root = root / "jobs"
        self.root.mkdir(parents=True, exist_ok=True)
        self.keys = KeyStore(root.parent)  # each job's result key (see ratchet.job.seal)
        self.backend_log = root / "backend.log"

    def dir(self, job_id: str) -> Path:
        return self.root / job_id

    def get(self, job_id: str) -> JobRecord | None:
        try:
            return JobRecord(**json.loads((self.dir(job_id) / "record.json").read_text()))
        except (OSError, ValueError, TypeError):
            return None

    def put(self, record: JobRecord) -> None:
        path = self.dir(record.job_id)
        path.mkdir(parents=True, exist_ok=True)
        tmp = path / "record.tmp"
        tmp.write_text(json.dumps(asdict(record)))
        tmp.replace(path / "record.json")

    def mark_cancelled(self, job_id: str) -> JobRecord | None:
        """Record a cancel; the record to stop on the engine, or None when there is
        nothing to stop (never placed, or already finished)."""
        record = self.get(job_id)
        if record is None or self.cached_result(job_id) is not None:
            return None
        record.stop_reason, record.stop_outcome = "cancelled", Outcome.CANCELLED
        self.put(record)
        return record

    def cached_result(self, job_id: str) -> JobResult | None:
        with contextlib.suppress(OSError, ValueError, TypeError):
            return JobResult.from_json((self.dir(job_id) / "result.json").read_text())
        return None

    def cache_result(self, job_id: str, result: JobResult, logs: str | None = None) -> None:
        path = self.dir(job_id)
        path.mkdir(parents=True, exist_ok=True)
        if logs is not None:
            (path / "engine.log").write_text(logs)
        tmp = path / "result.tmp"
        tmp.write_text(result.to_json())
        tmp.replace(path / "result.json")

    def note(self, message: str) -> None:
        """Infrastructure trouble goes to the user's terminal and to backend.log."""
        log.warning(message)
        with contextlib.suppress(OSError), self.backend_log.open("a") as fh:
            fh.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}\n")


def overdue(record: JobRecord, state: JobState | str, queue_timeout: float, store: RecordStore,
            now: float) -> str | None:
    """Why ratchet must stop this job now (its own deadlines), or None.

    Engines retry nothing and let a job sit PENDING forever: a job queued past
    `queue_timeout`, or running past `task.timeout` plus a grace, is ratchet's to stop.
    """
    if state == JobState.PENDING:
        waited = now - record.submitted_at
        if record.submitted_at and waited > queue_timeout:
            return (f"queue timeout: still pending after {waited:.0f}s "
                    f"(queue_timeout {queue_timeout:g}s); stopped by ratchet")
        return None
    if state == JobState.RUNNING:
        if record.running_at is None:
            record.running_at = now
            store.put(record)
        limit = (record.timeout_s or 0) + DEADLINE_GRACE_S
        if record.timeout_s and now - record.running_at > limit:
            return (f"job ran past its deadline ({limit:g}s = task.timeout "
                    f"+ {DEADLINE_GRACE_S:g}s grace); stopped by ratchet")
    return None


def stopped_result(record: JobRecord, worker: JobResult | None) -> JobResult:
    """A job we stopped ourselves: our reason wins over the worker's 'cancelled'."""
    result = worker or JobResult(job_id=record.job_id, outcome=record.stop_outcome)
    result.outcome = record.stop_outcome
    result.failed_stage = result.failed_stage or (
        "queue" if record.running_at is None else "job")
    result.reason = record.stop_reason or "stopped"
    return result


def add_engine_queue(result: JobResult, record: JobRecord) -> JobResult:
    """Engine queue wait = from placing the job until the worker started (same clock)."""
    if result.started_at and record.submitted_at:
        wait = max(0.0, result.started_at - record.submitted_at)
        result.queue_seconds = round(result.queue_seconds + wait, 4)
    elif record.running_at and record.submitted_at:
        result.queue_seconds = round(max(0.0, record.running_at - record.submitted_at), 4)
    return result
