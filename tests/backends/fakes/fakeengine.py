"""A tiny job engine behind fake `sbatch`/`squeue`/`sacct`/`scancel`, `vesslctl` and `sky`.

State lives in $FAKE_ENGINE_DIR: one JSON file per job, a log per job, and `calls.log`
(every invocation, for the tests to count). Jobs really run: the job's command is
started in the background in its own session, so ratchet's worker runs for real.
`config.json` in the state dir makes the engine misbehave on purpose:

- `fail_first`: verbs (submit, list, status, logs, cancel) whose first call fails;
- `id_delay`: list calls during which a new job is not listed yet (id appears late);
- `lose`: substrings of job names whose first job is lost (node died): it never runs,
  shows as queued until its id has been handed out, then the engine forgets it;
- `pending_s`: seconds a job stays queued before it starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

STATE = Path(os.environ.get("FAKE_ENGINE_DIR", "/tmp/fake-engine"))
JOBS = STATE / "jobs"


def config() -> dict:
    path = STATE / "config.json"
    return json.loads(path.read_text()) if path.exists() else {}


@contextlib.contextmanager
def locked():
    STATE.mkdir(parents=True, exist_ok=True)
    with open(STATE / "lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def called(tool: str, verb: str, argv: list[str]) -> None:
    """Record the call; fail it if the config says its first call fails."""
    with locked():
        with (STATE / "calls.log").open("a") as fh:
            fh.write(json.dumps({"tool": tool, "verb": verb, "argv": argv, "t": time.time()}) + "\n")
        if verb in config().get("fail_first", []):
            marker = STATE / f"failed-{tool}-{verb}"
            if not marker.exists():
                marker.touch()
                sys.stderr.write(f"{tool}: error: connection refused (transient, {verb})\n")
                sys.exit(1)


def _path(job_id: str) -> Path:
    return JOBS / f"{job_id}.json"


def load(job_id: str) -> dict | None:
    try:
        return json.loads(_path(job_id).read_text())
    except (OSError, ValueError):
        return None


def save(job: dict) -> None:
    JOBS.mkdir(parents=True, exist_ok=True)
    tmp = _path(job["id"]).with_suffix(".tmp")
    tmp.write_text(json.dumps(job))
    tmp.replace(_path(job["id"]))


def all_jobs() -> list[dict]:
    jobs = [load(p.stem) for p in sorted(JOBS.glob("*.json"))] if JOBS.exists() else []
    return sorted((j for j in jobs if j), key=lambda j: int(j["id"]))


def create(name: str, command: str, log: str | None = None, cwd: str | None = None,
           seen: bool = False) -> dict:
    with locked():
        counter = STATE / "counter"
        job_id = str(int(counter.read_text()) + 1 if counter.exists() else 1)
        counter.write_text(job_id)
        cfg = config()
        vanished = any(s in name for s in cfg.get("lose", [])) and not any(
            (STATE / f"lost-{s}").exists() for s in cfg.get("lose", []) if s in name)
        if vanished:
            for s in cfg.get("lose", []):
                if s in name:
                    (STATE / f"lost-{s}").touch()
        job = {"id": job_id, "name": name, "command": command, "created": time.time(),
               "log": log or str(JOBS / f"{job_id}.log"), "cwd": cwd, "pid": None,
               "vanished": vanished, "cancelled": False, "list_calls": 0, "seen": seen,
               "pending_s": float(cfg.get("pending_s", 0))}
        save(job)
    return job


def _start_if_due(job: dict) -> dict:
    if job["pid"] is None and not job["vanished"] and not job["cancelled"] and (
            time.time() - job["created"] >= job["pending_s"]):
        exit_file = JOBS / f"{job['id']}.exit"
        Path(job["log"]).parent.mkdir(parents=True, exist_ok=True)
        wrapped = f"({job['command']}) >> {job['log']} 2>&1; echo $? > {exit_file}"
        proc = subprocess.Popen(["/bin/sh", "-c", wrapped], cwd=job["cwd"] or None,
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        job["pid"] = proc.pid
        save(job)
    return job


def state(job: dict) -> str | None:
    """PENDING | RUNNING | COMPLETED | FAILED | CANCELLED, or None if the engine forgot it."""
    if job["vanished"]:
        gone = job["seen"] and time.time() - job["created"] > 0.5
        return None if gone else "PENDING"
    job = _start_if_due(job)
    if job["cancelled"]:
        return "CANCELLED"
    if job["pid"] is None:
        return "PENDING"
    exit_file = JOBS / f"{job['id']}.exit"
    if exit_file.exists():
        text = exit_file.read_text().strip()
        return "COMPLETED" if text == "0" else "FAILED"
    try:
        os.kill(job["pid"], 0)
        # a zombie of a finished sh counts as running until its exit file appears
        return "RUNNING"
    except ProcessLookupError:
        return "FAILED"


def find(job_id: str) -> dict | None:
    return load(job_id)


def listed(job: dict) -> bool:
    """The id appears late: hidden for the first `id_delay` list calls."""
    delay = int(config().get("id_delay", 0))
    with locked():
        fresh = load(job["id"]) or job
        fresh["list_calls"] = fresh.get("list_calls", 0) + 1
        visible = fresh["list_calls"] > delay
        fresh["seen"] = fresh["seen"] or visible
        save(fresh)
    return visible


def cancel(job: dict) -> None:
    job["cancelled"] = True
    save(job)
    if job["pid"]:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(job["pid"], signal.SIGTERM)


def read_log(job: dict) -> str:
    try:
        return Path(job["log"]).read_text(errors="replace")
    except OSError:
        return ""
