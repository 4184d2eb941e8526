"""The Ray backend's isolated mode (`[backend.ray] mode = "job"`): one Ray Job per job.

- `submission_id` is ratchet's deterministic job id (`<study>-<cand>-<attempt>`), so a
  restarted driver reattaches to a job that still runs instead of placing it twice.
- `working_dir` is a `git archive` of the pinned candidate commit with the spec in
  `.ratchet-job/` (and, for a hold-out follow-up job only, the hold-out data); the
  entrypoint is the trusted worker behind `ratchet.job.node`, which prints the
  worker's result marker as the job log's last line (the candidate's output is echoed
  with a `| ` prefix, never as a marker).
- GPUs/CPUs per job come from `[backend.ray] num_gpus / num_cpus`; Ray sets
  `CUDA_VISIBLE_DEVICES` and queues what does not fit.
- Ray retries nothing and lets a job sit PENDING forever, so ratchet owns the deadlines
  (engine.overdue); a job that ended without the worker's result is `lost`.

Each job pays for a Ray job driver (a second or more); the default actor mode
(ray_actors.py) does not.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import shlex
import tempfile
import time
from pathlib import Path

from ratchet.backends import Backend, BackendError, JobState
from ratchet.backends.engine import (
    DEADLINE_GRACE_S,
    JobRecord,
    RecordStore,
    add_engine_queue,
    engine_call,
    overdue,
    stopped_result,
)
from ratchet.backends.ray_settings import RayConfig, check_shared_prep
from ratchet.backends.remote import (
    forward_env,
    holdout_tar,
    parse_prep_output,
    parse_result,
    shared_prep,
)
from ratchet.core.vocab import Outcome
from ratchet.job import gitrepo
from ratchet.job.jobspec import JobResult, JobSpec
from ratchet.job.node import HOLDOUT_TAR, SPEC_DIR

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


def _is_not_found(exc: BaseException) -> bool:
    text = str(exc)
    return "404" in text or "does not exist" in text or "not found" in text.lower()


def _transient(exc: BaseException) -> bool:
    if isinstance(exc, TimeoutError | ConnectionError | OSError):
        return True
    try:
        import requests

        if isinstance(exc, requests.exceptions.RequestException):
            return True
    except ImportError:  # pragma: no cover
        pass
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "status code 5" in text or "No available agent" in text or "Connection" in text
    )


class _Transient(Exception):
    pass


class RayJobs(Backend):
    name = "ray"

    def __init__(self, cfg: RayConfig, store: RecordStore) -> None:
        self.cfg = cfg
        self.store = store
        self._client = None
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=4)
        self._seen: dict[str, tuple[float, JobState]] = {}  # job id -> (when, state)
        self.max_attempts = self.cfg.retries + 1

    def describe(self) -> str:
        gpus = f"{self.cfg.num_gpus:g} GPU" if self.cfg.num_gpus else "no GPU"
        return f"ray: {self.cfg.address} ({gpus}, {self.cfg.num_cpus or 0:g} CPU per job)"

    def job_dir(self, job_id: str) -> Path:
        return self.store.dir(job_id)

    # -- talking to the job server ----------------------------------------------------------

    def _call(self, what: str, fn, *args, **kwargs):
        """One job-server call: a hard timeout, backoff on connection errors."""

        def once():
            if self._client is None:
                from ray.job_submission import JobSubmissionClient

                future = self._pool.submit(JobSubmissionClient, self.cfg.address)
                self._client = future.result(timeout=self.cfg.request_timeout)
            future = self._pool.submit(getattr(self._client, fn), *args, **kwargs)
            try:
                return future.result(timeout=self.cfg.request_timeout)
            except Exception as exc:
                if _transient(exc) and not _is_not_found(exc):
                    raise _Transient(f"{type(exc).__name__}: {exc}") from exc
                raise

        return engine_call(once, f"ray {what} ({self.cfg.address})",
                           transient=(_Transient, TimeoutError), note=self.store.note)

    def _info(self, submission_id: str):
        """JobDetails, or None if the job server does not know the id."""
        try:
            return self._call(f"get_job_info {submission_id}", "get_job_info", submission_id)
        except RuntimeError as exc:
            if _is_not_found(exc):
                return None
            raise

    def _submit(self, submission_id: str, entrypoint: str, working_dir: Path,
                metadata: dict[str, str]) -> str:
        runtime_env = dict(self.cfg.runtime_env)
        runtime_env["working_dir"] = str(working_dir)
        try:
            return self._call(
                f"submit_job {submission_id}", "submit_job",
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env=runtime_env,
                entrypoint_num_cpus=self.cfg.num_cpus,
                entrypoint_num_gpus=self.cfg.num_gpus,
                entrypoint_memory=int(self.cfg.memory_gb * (1 << 30)) if self.cfg.memory_gb
                else None,
                entrypoint_resources=self.cfg.resources or None,
                metadata=metadata,
            )
        except RuntimeError as exc:
            if "already exists" in str(exc):
                self.store.note(f"{submission_id}: already on the cluster; reattached")
                return submission_id
            raise

    # -- verbs ----------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> str:
        job_id = spec.job_id
        if self.store.cached_result(job_id) is not None:
            return job_id
        record = self.store.get(job_id)
        if record is not None and record.engine_id and self._info(record.engine_id) is not None:
            return job_id  # reattach: the job server still runs (or ran) it
        spec.slots = []  # Ray places the job; no local slot leasing
        spec.slot_lock_dir = None
        forward_env(spec)
        fingerprint = hashlib.sha256(spec.to_json().encode()).hexdigest()[:12]
        # The id is the deterministic job id unless the cluster already holds a *different*
        # job under it (another study of the same name): then a suffixed, still
        # deterministic id. A job we placed ourselves carries our fingerprint.
        for engine_id in (job_id, f"{job_id}-{fingerprint}"):
            info = self._info(engine_id)
            if info is None:
                break
            if (info.metadata or {}).get("ratchet_spec") == fingerprint:
                self.store.note(f"{engine_id}: found on the cluster; reattached")
                self.store.put(JobRecord(job_id, engine_id, time.time(),
                                         timeout_s=spec.timeout_s))
                return job_id
        else:
            raise BackendError(f"{job_id}: the Ray cluster holds other jobs under this id")
        with tempfile.TemporaryDirectory(prefix="ratchet-ray-") as tmp:
            work = Path(tmp) / "snapshot"
            gitrepo.archive_to(Path(spec.repo or "."), spec.commit, work)
            (work / SPEC_DIR).mkdir(exist_ok=True)
            spec.write(work / SPEC_DIR / "spec.json")
            self.store.keys.write_for_worker(spec.job_id, work / SPEC_DIR)
            entry = (f"{shlex.quote(self.cfg.python)} -m ratchet.job.node job "
                     f"--spec {SPEC_DIR}/spec.json --workdir .")
            if holdout_tar(spec, work / SPEC_DIR / HOLDOUT_TAR):  # the hold-out job only
                entry += f" --holdout {SPEC_DIR}/{HOLDOUT_TAR}"
            record = JobRecord(job_id, engine_id, time.time(), timeout_s=spec.timeout_s)
            self.store.put(record)  # write-ahead: a crash here reattaches or finds it lost
            self._submit(engine_id, entry, work, {"ratchet_spec": fingerprint,
                                                  "ratchet_job": job_id})
        self._seen.pop(job_id, None)
        return job_id

    def _engine_id(self, job_id: str) -> str:
        record = self.store.get(job_id)
        return (record.engine_id if record else None) or job_id

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        return {job_id: self.status(job_id) for job_id in job_ids}

    def status(self, job_id: str) -> JobState:
        if self.store.cached_result(job_id) is not None:
            return JobState.DONE
        seen = self._seen.get(job_id)
        if seen and time.monotonic() - seen[0] < self.cfg.poll:
            return seen[1]
        state = self._status(job_id)
        self._seen[job_id] = (time.monotonic(), state)
        return state

    def _status(self, job_id: str) -> JobState:
        record = self.store.get(job_id) or JobRecord(job_id, job_id, time.time())
        engine_id = record.engine_id or job_id
        try:
            info = self._info(engine_id)
        except Exception as exc:  # the server is unreachable: keep waiting, say so
            self.store.note(f"{job_id}: job server unreachable ({exc}); will ask again")
            seen = self._seen.get(job_id)
            return seen[1] if seen else JobState.PENDING
        if info is None:
            record.lost = "the job server does not know this job (cluster restarted?)"
            self.store.put(record)
            self.store.note(f"{job_id}: lost: {record.lost}")
            return JobState.LOST
        status = str(getattr(info.status, "value", info.status))
        if status in ("PENDING", "RUNNING"):
            state = status.lower()
            reason = overdue(record, state, self.cfg.queue_timeout, self.store, time.time())
            return self._stop(record, reason, Outcome.TIMEOUT) if reason else JobState(state)
        if status not in TERMINAL:
            return JobState.RUNNING
        try:
            logs = self._call(f"get_job_logs {engine_id}", "get_job_logs", engine_id)
        except Exception as exc:
            self.store.note(f"{job_id}: could not fetch logs ({exc}); will ask again")
            return JobState.RUNNING
        worker = parse_result(logs, self.store.keys.get(job_id), job_id)
        if record.stop_reason:
            self.store.cache_result(job_id, stopped_result(record, worker), logs)
            return JobState.DONE
        if worker is None:
            record.lost = f"{status} without a worker result: {info.message or ''}".strip()
            self.store.put(record)
            self.store.note(f"{job_id}: lost: {record.lost}")
            with contextlib.suppress(OSError):
                (self.store.dir(job_id) / "engine.log").write_text(logs)
            return JobState.LOST
        if record.running_at is None and info.start_time:
            record.running_at = info.start_time / 1000.0
        self.store.cache_result(job_id, add_engine_queue(worker, record), logs)
        return JobState.DONE

    def _stop(self, record: JobRecord, reason: str, outcome: Outcome) -> JobState:
        record.stop_reason, record.stop_outcome = reason, outcome
        self.store.put(record)
        self.store.note(f"{record.job_id}: {reason}")
        try:
            engine_id = record.engine_id or record.job_id
            self._call(f"stop_job {engine_id}", "stop_job", engine_id)
        except Exception as exc:
            self.store.note(f"{record.job_id}: stop_job failed ({exc})")
        self.store.cache_result(record.job_id, stopped_result(record, None))
        return JobState.DONE

    def result(self, job_id: str) -> JobResult | None:
        return self.store.cached_result(job_id)

    def logs(self, job_id: str) -> str:
        try:
            engine_id = self._engine_id(job_id)
            return self._call(f"get_job_logs {engine_id}", "get_job_logs", engine_id)
        except Exception:
            path = self.store.dir(job_id) / "engine.log"
            return path.read_text(errors="replace") if path.exists() else ""

    def cancel(self, job_id: str) -> None:
        record = self.store.mark_cancelled(job_id)
        if record is None:
            return
        with contextlib.suppress(Exception):
            engine_id = record.engine_id or job_id
            self._call(f"stop_job {engine_id}", "stop_job", engine_id)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def node_count(self) -> int:
        from ray.util.state import list_nodes

        try:
            nodes = list_nodes(address=self.cfg.address, timeout=int(self.cfg.request_timeout))
        except Exception as exc:  # noqa: BLE001 - the state API's own errors
            raise BackendError(f"ray list_nodes ({self.cfg.address}): {exc}") from None
        return sum(1 for node in nodes if str(node.state) == "ALIVE")

    # -- prepared data: once, on the cluster, into data_uri ---------------------------------

    def prepare(self, *, study: str, repo: Path, command: str, pinned_commit: str,
                key: str, env_allow: list[str], timeout_s: float) -> tuple[str, str] | None:
        from ratchet.job.prep import PrepError

        if not self.cfg.data_uri:
            check_shared_prep(self.node_count())
            return None  # local prep cache (fine for a single-node cluster)
        root = Path(self.cfg.data_uri.removeprefix("file://"))
        ready = shared_prep(root, key, repo=repo, pinned_commit=pinned_commit, command=command,
                            env_allow=env_allow, timeout_s=timeout_s,
                            here=self.cfg.prep == "local")
        if ready is not None:
            return ready
        entry = [self.cfg.python, "-m", "ratchet.job.node", "prep", "--root", str(root),
                 "--key", key, "--command", command, "--timeout", str(timeout_s),
                 "--workdir", "."]
        for name in env_allow:
            entry += ["--env-allow", name]
        entrypoint = " ".join(shlex.quote(a) for a in entry)
        last_error = "no attempt"
        # Prep job ids count up: reattach to one still running (a restarted driver), else
        # place a new one. A new one finds a finished manifest and returns at once, so
        # data is prepared once even when the driver cannot see the shared location.
        serial = 0
        while self._info(f"{study}-prep-{key}-{serial}") is not None:
            serial += 1
        if serial:
            info = self._info(f"{study}-prep-{key}-{serial - 1}")
            if str(getattr(info.status, "value", info.status)) not in TERMINAL:
                serial -= 1
        for attempt in range(serial, serial + self.cfg.retries + 1):
            job_id = f"{study}-prep-{key}-{attempt}"
            info = self._info(job_id)
            if info is None:
                with tempfile.TemporaryDirectory(prefix="ratchet-prep-") as tmp:
                    gitrepo.archive_to(repo, pinned_commit, Path(tmp) / "work")
                    self._submit(job_id, entrypoint, Path(tmp) / "work",
                                 {"ratchet_prep": key})
            else:
                self.store.note(f"prep job {job_id} is still running; reattached")
            deadline = time.time() + self.cfg.queue_timeout + timeout_s + DEADLINE_GRACE_S
            while True:
                info = self._info(job_id)
                status = str(getattr(info.status, "value", info.status)) if info else "LOST"
                if status in (*TERMINAL, "LOST"):
                    break
                if time.time() > deadline:
                    with contextlib.suppress(Exception):
                        self._call(f"stop_job {job_id}", "stop_job", job_id)
                    raise PrepError(f"prep job {job_id} did not finish in time; stopped")
                time.sleep(self.cfg.poll)
            logs = self._call(f"get_job_logs {job_id}", "get_job_logs", job_id) if info else ""
            out = parse_prep_output(logs)
            if out and "error" in out:
                raise PrepError(out["error"])
            if out:
                return out["data_dir"], out["digest"]
            last_error = f"{status}: {getattr(info, 'message', '')}"
            self.store.note(f"prep job {job_id} lost ({last_error}); retrying")
        raise PrepError(f"prep job on the Ray cluster failed: {last_error}")
