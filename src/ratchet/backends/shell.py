"""The shell backend: any job queue driven by its CLI, through command templates.

One adapter, configured per engine (presets: `slurm`, `vessl`, `skypilot`; every key
can be overridden in `[backend.shell]`):

- **stage**: the pinned commit is written as `snapshot.tar` (`git archive` of the SHA,
  never a branch) with `spec.json` and any rendered `files` (batch script, task.yaml)
  into `stage_dir/<name>/`, a directory the job's machine sees (shared filesystem,
  mounted bucket, object volume); an optional `stage` hook then runs here (rsync, a
  bucket upload, a push of the SHA to a remote ref...).
- **submit** runs the submit template; the engine id is parsed from its output
  (`id_regex`) or found by name in a list command (`id_command`), retried while it
  appears late. The job runs `python -m ratchet.job.node job ...`: the trusted
  worker on the staged snapshot, its result marker last in the engine's log.
- **status** maps the engine's state through `states` to pending / running /
  succeeded / failed / cancelled (unknown: running). A job the engine no longer knows
  (and whose log has no result) is `lost`, rerun by the study up to `retries` times; a
  job that ended with the worker's result is never rerun.
- every call has a timeout (`call_timeout`) and is made once; a failed call raises and
  the study retries it with backoff (shown and logged); queue timeout and the job
  deadline are ratchet's, as for Ray.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shlex
import shutil
import subprocess
import tempfile
import time
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ratchet.backends import Backend, BackendError, JobState, register_backend
from ratchet.backends.engine import (
    DEADLINE_GRACE_S,
    JobRecord,
    RecordStore,
    add_engine_queue,
    engine_call,
    overdue,
    stopped_result,
)
from ratchet.backends.presets import PRESETS
from ratchet.backends.remote import (
    forward_env,
    holdout_tar,
    parse_prep_output,
    parse_result,
    shared_prep,
)
from ratchet.core.config import Backend as BackendSection
from ratchet.core.config import ConfigError, Duration, SectionError, section
from ratchet.core.vocab import Outcome
from ratchet.job import gitrepo
from ratchet.job.jobspec import JobResult, JobSpec
from ratchet.job.node import HOLDOUT_TAR


class EngineState(StrEnum):
    """What `[backend.shell] states` maps an engine's own words to."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def in_flight(self) -> bool:
        return self in (EngineState.PENDING, EngineState.RUNNING)


STATES = tuple(s.value for s in EngineState)


class ShellConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    preset: str | None = None
    stage_dir: str  # where staged jobs live, as seen from this machine
    remote_stage_dir: str | None = None  # the same place as the job sees it (default: same)
    stage: str | None = None  # hook run after staging (placeholders as below)
    files: dict[str, str] = {}  # extra files rendered into each job's stage dir
    submit: str
    id_regex: str | None = None  # engine id from submit's output: group 'id' (or 1)
    id_command: str | None = None  # else: a list command searched for the job's name
    id_json_name: str | None = None  # ... as JSON: objects whose this field == name
    id_json_id: str | None = None  # ... give the id in this field
    id_list_regex: str | None = None  # ... or as text: a regex with {name}, group 'id'
    id_wait: Duration = 120.0  # how long an id may take to appear
    status: str
    status_json: str | None = None  # state = this (dotted) field of JSON output
    status_regex: str | None = None  # state = group 'state' (or 1); default: first word
    status_all: str | None = None  # ONE call giving every job's state ({ids}: all ids)
    status_all_regex: str | None = None  # ... one match per job: groups 'id' and 'state'
    status_fallback: str | None = None  # asked when the queue no longer lists the job
    fallback_unavailable_regex: str | None = None  # its "I keep no records" answer
    gone_grace: Duration = 10.0  # a job off the queue may take this long to show its log
    missing_regex: str | None = None  # a failing call whose output says "no such job"
    states: dict[str, str] = {}
    logs: str
    cancel: str
    vars: dict[str, str] = {}
    python: str = "python"  # the interpreter on the job's machine that has ratchet
    data_dir: str | None = None  # shared location for prepared data (prepared once)
    prep: str = Field(default="local", pattern="^(engine|local)$")
    queue_timeout: Duration = 3600.0
    retries: int = Field(default=1, ge=0, le=10)
    call_timeout: Duration = 60.0  # each call (a failed one: the study retries it)
    poll: Duration = 2.0

    @model_validator(mode="before")
    @classmethod
    def _preset_first(cls, raw: Any) -> Any:
        """A preset's keys, then the table's own (vars, files and states merged)."""
        if not isinstance(raw, dict) or raw.get("preset") is None:
            return raw
        preset = raw["preset"]
        if preset not in PRESETS:
            raise ValueError(f"preset: unknown preset {preset!r} "
                             f"(expected one of {', '.join(sorted(PRESETS))})")
        merged = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PRESETS[preset].items()}
        for key, value in raw.items():
            if key in ("vars", "files", "states") and isinstance(value, dict):
                merged[key] = {**merged.get(key, {}), **value}
            else:
                merged[key] = value
        return merged

    @model_validator(mode="after")
    def _consistent(self) -> ShellConfig:
        for engine_state, ours in self.states.items():
            if ours not in STATES:
                raise ValueError(f"states.{engine_state}: {ours!r} is not one of "
                                 f"{', '.join(STATES)}")
        patterns = {"id_regex": self.id_regex, "id_list_regex": self.id_list_regex,
                    "status_regex": self.status_regex, "status_all_regex": self.status_all_regex,
                    "missing_regex": self.missing_regex,
                    "fallback_unavailable_regex": self.fallback_unavailable_regex}
        for key, pattern in patterns.items():
            if pattern:
                try:
                    re.compile(pattern.replace("{id}", "0").replace("{name}", "x"))
                except re.error as exc:
                    raise ValueError(f"{key}: not a valid regex: {exc}") from None
        if not self.id_regex and not self.id_command:
            raise ValueError("give id_regex (id from submit's output) or id_command")
        return self

    def template(self, key: str) -> str:
        """The command template under `key` (submit, status, logs, ...)."""
        value = getattr(self, key)  # one of this model's template fields
        if not isinstance(value, str):
            raise ConfigError(f"backend.shell.{key}: not set")
        return value


def load_shell_config(raw: dict) -> ShellConfig:
    """The `[backend.shell]` table, validated (errors name the key)."""
    try:
        return section(ShellConfig, raw, "backend.shell")
    except SectionError as exc:
        raise ConfigError(str(exc)) from None


class _CallFailed(Exception):
    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


@register_backend("shell", settings=ShellConfig,
                  summary="command templates: Slurm, VESSL, SkyPilot or your own queue")
class ShellBackend(Backend):
    name = "shell"

    def __init__(self, state_dir: Path, settings: ShellConfig,
                 backend: BackendSection | None = None) -> None:
        del backend  # everything the engine's CLI needs is in [backend.shell]
        self.cfg = settings
        self._states = {k.upper(): v for k, v in settings.states.items()}  # engine word -> ours
        self.store = RecordStore(state_dir / "shell")
        self.stage_root = Path(self.cfg.stage_dir).expanduser()
        self.remote_root = self.cfg.remote_stage_dir or str(self.stage_root)
        self._seen: dict[str, tuple[float, JobState]] = {}
        self._gone_since: dict[str, float] = {}  # job id -> when it left the queue
        self._fallback_unavailable = False  # the fallback said it keeps no records
        self.max_attempts = self.cfg.retries + 1

    def describe(self) -> str:
        return f"shell: {self.cfg.preset or 'custom'} (staged in {self.stage_root})"

    def job_dir(self, job_id: str) -> Path:
        return self.store.dir(job_id)

    # -- running the engine's CLI -----------------------------------------------------------

    def _values(self, name: str, engine_id: str | None = None, command: str = "") -> dict:
        stage = f"{self.remote_root}/{name}"
        return {**self.cfg.vars, "name": name, "id": engine_id or "", "stage": stage,
                "local_stage": str(self.stage_root / name), "command": command,
                "command_q": shlex.quote(command), "python": self.cfg.python}

    def _render(self, template: str, values: dict, key: str) -> str:
        try:
            return template.format_map(values)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"backend.shell.{key}: unknown placeholder {exc} in {template!r} "
                              "(add it under [backend.shell.vars])") from None

    def _run(self, key: str, values: dict, *, missing_ok: bool = False) -> tuple[bool, str]:
        """Run one template, once, with its timeout. (True, out), or (False, out) when the
        engine says there is no such job; a failure raises BackendError."""
        command = self._render(self.cfg.template(key), values, key)
        missing = self.cfg.missing_regex

        def once() -> tuple[bool, str]:
            try:
                proc = subprocess.run(["/bin/sh", "-c", command], capture_output=True,
                                      text=True, timeout=self.cfg.call_timeout,
                                      stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired:
                raise _CallFailed(f"timed out after {self.cfg.call_timeout:g}s") from None
            out = proc.stdout + (("\n" + proc.stderr) if proc.stderr.strip() else "")
            if proc.returncode == 0:
                return True, proc.stdout
            if missing_ok and missing and re.search(missing, out):
                return False, out
            raise _CallFailed(f"exit code {proc.returncode}: {out.strip()[-300:]}", out)

        return engine_call(once, f"{key} `{command[:120]}`", transient=(_CallFailed,),
                           note=self.store.note)

    def _find_id(self, name: str) -> str | None:
        if not self.cfg.id_command:
            return None
        _, out = self._run("id_command", self._values(name))
        if self.cfg.id_json_name and self.cfg.id_json_id:
            try:
                data = json.loads(out)
            except ValueError:
                return None
            if isinstance(data, dict):
                data = next((v for v in data.values() if isinstance(v, list)), [])
            for item in data if isinstance(data, list) else []:
                if isinstance(item, dict) and str(item.get(self.cfg.id_json_name)) == name:
                    return str(item.get(self.cfg.id_json_id))
            return None
        pattern = (self.cfg.id_list_regex or r"(?m)^\s*(?P<id>\S+)\s.*\b{name}\b").replace(
            "{name}", re.escape(name))
        match = re.search(pattern, out)
        return _group(match, "id") if match else None

    # -- placing a job ----------------------------------------------------------------------

    def _stage(self, name: str, command: str, commit: str, repo: Path,
               spec: JobSpec | None) -> None:
        local = self.stage_root / name
        if local.exists():
            shutil.rmtree(local)
        local.mkdir(parents=True)
        with tempfile.TemporaryDirectory(prefix="ratchet-stage-") as tmp:
            snap = Path(tmp) / "snapshot"
            gitrepo.archive_to(repo, commit, snap)
            subprocess.run(["tar", "-cf", str(local / "snapshot.tar"), "-C", str(snap), "."],
                           check=True)
        if spec is not None:
            spec.write(local / "spec.json")
            self.store.keys.write_for_worker(spec.job_id, local)
            # only the hold-out follow-up job ever carries the hold-out data
            holdout_tar(spec, local / HOLDOUT_TAR)
        values = self._values(name, command=command)
        for filename, template in self.cfg.files.items():
            path = local / filename
            path.write_text(self._render(template, values, f"files.{filename}"))
            path.chmod(0o755)
        if self.cfg.stage:
            self._run("stage", values)

    def _place(self, record: JobRecord, name: str, command: str) -> str:
        """Submit once; the engine id, also recorded. A failed call raises; the study calls
        `submit` again, which looks the job up by name (the record is written ahead)
        before submitting again."""
        _, out = self._run("submit", self._values(name, command=command))
        if self.cfg.id_regex:
            match = re.search(self.cfg.id_regex.replace("{name}", re.escape(name)), out,
                              re.MULTILINE)
            if match:
                record.engine_id = _group(match, "id")
                self.store.put(record)
                return record.engine_id
        return self._await_id(record, name)

    def _await_id(self, record: JobRecord, name: str) -> str:
        """Wait (within `id_wait`) for a submitted job to be listed: the engine showing
        what it already did, not a retry of a failed call."""
        deadline = time.monotonic() + self.cfg.id_wait
        delay = min(self.cfg.poll, 1.0)
        while True:
            found = self._find_id(name)
            if found:
                record.engine_id = found
                self.store.put(record)
                return found
            if time.monotonic() > deadline:
                raise BackendError(f"{name}: submitted, but no engine id appeared within "
                                   f"{self.cfg.id_wait:g}s")
            self.store.note(f"{name}: id not listed yet; retrying in {delay:.1f}s")
            time.sleep(delay)
            delay = min(delay * 2, 5.0)

    def _job_command(self, name: str, holdout: bool) -> str:
        stage = f"{self.remote_root}/{name}"
        command = (f"{shlex.quote(self.cfg.python)} -m ratchet.job.node job "
                   f"--spec {shlex.quote(stage + '/spec.json')} "
                   f"--archive {shlex.quote(stage + '/snapshot.tar')} "
                   f"--job-dir {shlex.quote(stage + '/job')}")
        if holdout:  # staged for this job alone; the job deletes it once unpacked
            command += f" --holdout {shlex.quote(stage + '/' + HOLDOUT_TAR)}"
        return command

    # -- verbs ----------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> str:
        job_id = spec.job_id
        if self.store.cached_result(job_id) is not None:
            return job_id
        spec.slots, spec.slot_lock_dir = [], None
        forward_env(spec)
        fingerprint = hashlib.sha256(spec.to_json().encode()).hexdigest()[:8]
        name = f"{job_id}-{fingerprint}"  # deterministic, and unique to this spec
        record = self.store.get(job_id)
        if record is not None and record.engine_id:
            return job_id  # reattach
        if record is not None:  # the driver died between recording and learning the id
            found = self._find_id(name)
            if found:
                record.engine_id = found
                self.store.put(record)
                self.store.note(f"{job_id}: found on the engine as {found}; reattached")
                return job_id
        holdout = spec.holdout_only and spec.holdout_dir is not None and \
            Path(spec.holdout_dir).is_dir()
        command = self._job_command(name, holdout)
        self._stage(name, command, spec.commit, Path(spec.repo or "."), spec)
        record = JobRecord(job_id, None, time.time(), timeout_s=spec.timeout_s)
        self._save_name(job_id, name)
        self.store.put(record)  # write-ahead: a restarted driver looks the name up
        self._place(record, name, command)
        self._seen.pop(job_id, None)
        return job_id

    def _save_name(self, job_id: str, name: str) -> None:
        self.store.dir(job_id).mkdir(parents=True, exist_ok=True)
        (self.store.dir(job_id) / "name").write_text(name)

    def _name(self, job_id: str) -> str:
        with contextlib.suppress(OSError):
            return (self.store.dir(job_id) / "name").read_text().strip()
        return job_id

    def status(self, job_id: str) -> JobState:
        return self.poll([job_id])[job_id]

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        """Every job's state from ONE engine call (`status_all`: squeue, sky jobs queue);
        logs only for jobs that left the queue. A failing call raises BackendError (the
        study retries with backoff); nothing here retries or sleeps."""
        now = time.monotonic()
        states: dict[str, JobState] = {}
        ask: list[tuple[str, JobRecord, str]] = []  # job id, its record, engine id
        for job_id in job_ids:
            seen = self._seen.get(job_id)
            if self.store.cached_result(job_id) is not None:
                states[job_id] = JobState.DONE
            elif seen and now - seen[0] < self.cfg.poll:
                states[job_id] = seen[1]
            else:
                record = self.store.get(job_id)
                if record is None:
                    states[job_id] = JobState.LOST
                elif (engine_id := record.engine_id or self._learn_id(record)) is None:
                    states[job_id] = self._no_id_yet(record)
                else:
                    ask.append((job_id, record, engine_id))
        if ask:
            listed: dict[str, EngineState | None]
            if self.cfg.status_all:
                listed = {**self._list_states([e for _, _, e in ask])}
            else:
                listed = {e: self._engine_state(self._name(j), e) for j, _, e in ask}
            for job_id, record, engine_id in ask:
                states[job_id] = self._judge(job_id, record, engine_id, listed.get(engine_id))
                self._seen[job_id] = (now, states[job_id])
        return states

    def _learn_id(self, record: JobRecord) -> str | None:
        found = self._find_id(self._name(record.job_id))
        if found:
            record.engine_id = found
            self.store.put(record)
        return found

    def _no_id_yet(self, record: JobRecord) -> JobState:
        if time.time() - record.submitted_at > self.cfg.id_wait:
            record.lost = "the engine never listed the job"
            self.store.put(record)
            return JobState.LOST
        return JobState.PENDING

    def _list_states(self, engine_ids: list[str]) -> dict[str, EngineState]:
        """One call for all jobs: engine id -> our state, for the jobs the engine lists."""
        ids = ",".join(engine_ids)
        _, out = self._run("status_all", {**self._values("", ""), "ids": ids})
        found: dict[str, EngineState] = {}
        if self.cfg.status_all_regex:
            for match in re.finditer(self.cfg.status_all_regex, out, re.MULTILINE):
                found[_group(match, "id")] = self._ours(_group(match, "state"))
            return found
        for engine_id in engine_ids:  # one listing, parsed per job (status_regex with {id})
            raw = self._parse_state(out, engine_id)
            if raw:
                found[engine_id] = self._ours(raw)
        return found

    def _ours(self, word: str) -> EngineState:
        """The engine's word for a state as ours, through `states` (unknown: running)."""
        mapped = self._states.get(word.upper())
        return EngineState(mapped) if mapped else EngineState.RUNNING

    def _engine_state(self, name: str, engine_id: str) -> EngineState | None:
        """One job's state from `status` alone (None: the engine does not list it)."""
        ok, out = self._run("status", self._values(name, engine_id), missing_ok=True)
        raw = self._parse_state(out, engine_id) if ok else None
        if not raw:
            return None
        return self._ours(raw)

    def _fallback_state(self, name: str, engine_id: str) -> EngineState | None:
        """The second opinion (sacct) on a job the queue forgot, where the engine keeps
        one. "Accounting storage is disabled" is an answer, not trouble: asked once."""
        if not self.cfg.status_fallback or self._fallback_unavailable:
            return None
        try:
            ok, out = self._run("status_fallback", self._values(name, engine_id),
                                missing_ok=True)
        except BackendError as exc:
            text = str(exc)
            if self.cfg.fallback_unavailable_regex and re.search(
                    self.cfg.fallback_unavailable_regex, text):
                self._fallback_unavailable = True
                self.store.note("status_fallback is unavailable on this engine "
                                f"({text[-120:].strip()}); the queue and the job's log "
                                "decide alone")
                return None
            raise
        raw = self._parse_state(out, engine_id) if ok else None
        if not raw:
            return None
        return self._ours(raw.split()[0])

    def _parse_state(self, out: str, engine_id: str) -> str | None:
        if self.cfg.status_json:
            try:
                value = json.loads(out)
            except ValueError:
                return None
            for part in self.cfg.status_json.split("."):
                value = value.get(part) if isinstance(value, dict) else None
            return str(value) if value not in (None, "") else None
        if self.cfg.status_regex:
            match = re.search(self.cfg.status_regex.replace("{id}", re.escape(engine_id)), out,
                              re.MULTILINE)
            return _group(match, "state") if match else None
        words = out.split()
        return words[0] if words else None

    def _judge(self, job_id: str, record: JobRecord, engine_id: str,
               state: EngineState | None) -> JobState:
        """Our state for one job, given what the engine listed (None: not listed)."""
        name = self._name(job_id)
        if state is not None and state.in_flight:
            self._gone_since.pop(job_id, None)
            reason = overdue(record, state, self.cfg.queue_timeout, self.store, time.time())
            return self._stop(record, name, reason, Outcome.TIMEOUT) if reason else JobState(state)
        # finished, or left the queue: the job's log decides (its last line is the
        # worker's result); no second call when it is there
        logs = self._logs(name, engine_id)
        worker = parse_result(logs, self.store.keys.get(job_id), job_id)
        if record.stop_reason:
            self.store.cache_result(job_id, stopped_result(record, worker), logs)
            return JobState.DONE
        if worker is not None:
            self._gone_since.pop(job_id, None)
            self.store.cache_result(job_id, add_engine_queue(worker, record), logs)
            return JobState.DONE
        if state is None:  # not listed, no result (yet): ask the fallback, then wait a bit
            fallback = self._fallback_state(name, engine_id)
            if fallback is not None and fallback.in_flight:
                return JobState(fallback)
            first = self._gone_since.setdefault(job_id, time.monotonic())
            if fallback is None and time.monotonic() - first < self.cfg.gone_grace:
                return JobState.RUNNING  # a shared filesystem may show the log's end late
            state = fallback
        record.lost = (f"engine state {state}, no worker result in the log"
                       if state else "the engine no longer knows the job")
        self.store.put(record)
        self.store.note(f"{job_id} ({record.engine_id}): lost: {record.lost}")
        return JobState.LOST

    def _logs(self, name: str, engine_id: str | None) -> str:
        try:
            ok, out = self._run("logs", self._values(name, engine_id), missing_ok=True)
        except BackendError as exc:
            self.store.note(f"{name}: could not read logs ({exc})")
            return ""
        return out if ok else ""

    def _stop(self, record: JobRecord, name: str, reason: str, outcome: Outcome) -> JobState:
        record.stop_reason, record.stop_outcome = reason, outcome
        self.store.put(record)
        self.store.note(f"{record.job_id}: {reason}")
        with contextlib.suppress(BackendError):
            self._run("cancel", self._values(name, record.engine_id), missing_ok=True)
        self.store.cache_result(record.job_id, stopped_result(record, None))
        return JobState.DONE

    def result(self, job_id: str) -> JobResult | None:
        return self.store.cached_result(job_id)

    def logs(self, job_id: str) -> str:
        record = self.store.get(job_id)
        cached = self.store.dir(job_id) / "engine.log"
        if cached.exists():
            return cached.read_text(errors="replace")
        if record is None or not record.engine_id:
            return ""
        return self._logs(self._name(job_id), record.engine_id)

    def cancel(self, job_id: str) -> None:
        record = self.store.mark_cancelled(job_id)
        if record is None:
            return
        if record.engine_id:
            with contextlib.suppress(BackendError):
                self._run("cancel", self._values(self._name(job_id), record.engine_id),
                          missing_ok=True)

    def close(self) -> None:
        pass

    # -- prepared data: once, into data_dir -------------------------------------------------

    def prepare(self, *, study: str, repo: Path, command: str, pinned_commit: str,
                key: str, env_allow: list[str], timeout_s: float) -> tuple[str, str] | None:
        from ratchet.job.prep import PrepError

        if not self.cfg.data_dir:
            return None
        root = Path(self.cfg.data_dir)
        ready = shared_prep(root, key, repo=repo, pinned_commit=pinned_commit, command=command,
                            env_allow=env_allow, timeout_s=timeout_s,
                            here=self.cfg.prep == "local")
        if ready is not None:
            return ready
        # one prep job on the engine; it returns at once if another already prepared
        name = f"{study}-prep-{key}-{int(time.time())}"
        stage = f"{self.remote_root}/{name}"
        argv = [self.cfg.python, "-m", "ratchet.job.node", "prep", "--root", str(root),
                "--key", key, "--command", command, "--timeout", str(timeout_s),
                "--archive", f"{stage}/snapshot.tar"]
        for env_name in env_allow:
            argv += ["--env-allow", env_name]
        job_command = " ".join(shlex.quote(a) for a in argv)
        self._stage(name, job_command, pinned_commit, repo, None)
        record = JobRecord(name, None, time.time(), timeout_s=timeout_s)
        engine_id = self._place(record, name, job_command)
        deadline = time.time() + self.cfg.queue_timeout + timeout_s + DEADLINE_GRACE_S
        while time.time() < deadline:
            try:
                state = self._engine_state(name, engine_id)
            except BackendError as exc:
                self.store.note(f"prep job {name}: {exc}")
                state = EngineState.RUNNING
            if state is None or not state.in_flight:
                out = parse_prep_output(self._logs(name, engine_id))
                if out and "error" in out:
                    raise PrepError(out["error"])
                if out:
                    return out["data_dir"], out["digest"]
                raise PrepError(f"prep job {name} ended ({state or 'gone'}) without a result")
            time.sleep(self.cfg.poll)
        with contextlib.suppress(BackendError):
            self._run("cancel", self._values(name, engine_id), missing_ok=True)
        raise PrepError(f"prep job {name} did not finish in time; cancelled")


def _group(match: re.Match, name: str) -> str:
    groups = match.groupdict()
    value = groups.get(name) if name in groups else match.group(1)
    return (value or "").strip()  # a group that matched nothing is an empty answer
