"""The local backend: one worker process per job on this machine, slots leased by flock.

Each job is `python -m ratchet.worker .ratchet/jobs/<id>` in its own session. The
worker itself leases a slot (one lock file per slot), so slot accounting survives a
driver restart and is shared by `ratchet submit` calls from different processes; a
worker that dies releases its slot with its file descriptors.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from ratchet.backends import JobState
from ratchet.faults import fault_point
from ratchet.jobspec import JobResult, JobSpec, Slot


def visible_gpus() -> list[str]:
    """GPU ids this process may use: CUDA_VISIBLE_DEVICES if set, else nvidia-smi."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(out.splitlines()) if line.startswith("GPU ")]


def plan_slots(slots: int | None, gpus: list[str] | None = None) -> list[Slot]:
    """Default: one slot per GPU if any, else one per core. CPUs split between slots."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(
        range(os.cpu_count() or 1)
    )
    gpus = visible_gpus() if gpus is None else gpus
    count = slots or (len(gpus) if gpus else len(cores))
    plan = []
    for i in range(count):
        if count <= len(cores):
            cpus = [c for j, c in enumerate(cores) if j % count == i]
        else:  # more slots than cores (e.g. sleep-bound tasks): share round-robin
            cpus = [cores[i % len(cores)]]
        env = {}
        name = f"cpu{i}"
        if gpus:
            gpu = gpus[i % len(gpus)]
            env["CUDA_VISIBLE_DEVICES"] = gpu
            name = f"gpu{gpu}" if count <= len(gpus) else f"gpu{gpu}.{i // len(gpus)}"
        env["OMP_NUM_THREADS"] = str(len(cpus))
        plan.append(Slot(name=name, env=env, cpus=cpus))
    return plan


class LocalBackend:
    name = "local"

    def __init__(self, state_dir: Path, backend_config=None) -> None:
        self.jobs_dir = state_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.lock_dir = state_dir / "slots"
        slots = getattr(backend_config, "slots", None)
        gpus = getattr(backend_config, "gpus", None)
        self.slots = plan_slots(slots, gpus)
        self._children: dict[str, subprocess.Popen] = {}

    def describe(self) -> str:
        return f"local: {len(self.slots)} slots ({', '.join(s.name for s in self.slots)})"

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    # -- verbs ----------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> str:
        job_dir = self.job_dir(spec.job_id)
        if (self._alive(spec.job_id) or (job_dir / "result.json").exists()
                or (job_dir / "pid.json").exists()):
            return spec.job_id  # idempotent: already placed (a dead one is `lost`, not rerun)
        job_dir.mkdir(parents=True, exist_ok=True)
        spec.slots = self.slots
        spec.slot_lock_dir = str(self.lock_dir)
        spec.write(job_dir / "spec.json")
        with (job_dir / "worker.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ratchet.worker", str(job_dir)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=job_dir,
            )
        self._children[spec.job_id] = proc
        fault_point("spawned")
        created = psutil.Process(proc.pid).create_time()
        (job_dir / "pid.json").write_text(json.dumps({"pid": proc.pid, "created": created}))
        return spec.job_id

    def status(self, job_id: str) -> JobState:
        job_dir = self.job_dir(job_id)
        if (job_dir / "result.json").exists():
            self._reap(job_id, block=False)  # the worker may still be exiting: don't wait
            return "done"
        if self._alive(job_id):
            try:
                state = json.loads((job_dir / "state.json").read_text())["state"]
            except (OSError, ValueError, KeyError):
                return "pending"
            return "pending" if state == "pending" else "running"
        # exited: the result may have landed between our two checks
        if (job_dir / "result.json").exists():
            return "done"
        self._kill_leftovers(job_id)  # the worker died: its phase tree must not outlive it
        return "lost"

    def result(self, job_id: str) -> JobResult | None:
        path = self.job_dir(job_id) / "result.json"
        try:
            return JobResult.from_json(path.read_text())
        except (OSError, ValueError):
            return None

    def logs(self, job_id: str) -> str:
        job_dir = self.job_dir(job_id)
        parts = []
        for log in sorted((job_dir / "logs").glob("*.log")) if job_dir.exists() else []:
            parts.append(f"==> {log.name} <==\n{log.read_text(errors='replace')}")
        worker = job_dir / "worker.log"
        if worker.exists():
            text = worker.read_text(errors="replace").strip()
            if text:
                parts.append(f"==> worker.log <==\n{text}")
        return "\n".join(parts)

    def cancel(self, job_id: str, grace_s: float = 10.0) -> None:
        pid = self._pid(job_id)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)  # the worker kills its phase tree and reports
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and self._alive(job_id):
            time.sleep(0.05)
        if self._alive(job_id):
            from ratchet.procs import kill_tree

            kill_tree(pid)
        self._reap(job_id)

    def close(self) -> None:
        for job_id in list(self._children):
            if (self.job_dir(job_id) / "result.json").exists():
                self._reap(job_id)  # finished: let it exit; running jobs stay detached

    # -- process bookkeeping -----------------------------------------------------------------

    def _pid(self, job_id: str) -> int | None:
        try:
            info = json.loads((self.job_dir(job_id) / "pid.json").read_text())
        except (OSError, ValueError):
            return self._find_worker(job_id)
        try:
            proc = psutil.Process(info["pid"])
            if abs(proc.create_time() - info["created"]) > 1.0:
                return None  # pid reused by an unrelated process
            if proc.status() == psutil.STATUS_ZOMBIE:
                self._reap(job_id)
                return None
        except psutil.Error:
            return None
        return info["pid"]

    def _find_worker(self, job_id: str) -> int | None:
        """A worker whose pid.json was never written (driver killed right after spawning)."""
        job_dir = str(self.job_dir(job_id))
        if not (self.job_dir(job_id) / "spec.json").exists():
            return None  # never placed: nothing to look for
        for proc in psutil.process_iter(["cmdline", "create_time"]):
            cmdline = proc.info["cmdline"] or []
            if "ratchet.worker" in cmdline and job_dir in cmdline:
                with contextlib.suppress(OSError):
                    (self.job_dir(job_id) / "pid.json").write_text(json.dumps(
                        {"pid": proc.pid, "created": proc.info["create_time"]}))
                return proc.pid
        return None

    def _kill_leftovers(self, job_id: str) -> None:
        """Kill processes of a job whose worker vanished (they run in their own sessions)."""
        for proc in psutil.process_iter(["environ"]):
            with contextlib.suppress(psutil.Error):
                if (proc.info["environ"] or {}).get("RATCHET_JOB_ID") == job_id:
                    proc.kill()

    def _alive(self, job_id: str) -> bool:
        child = self._children.get(job_id)
        if child is not None:
            return child.poll() is None
        return self._pid(job_id) is not None

    def _reap(self, job_id: str, block: bool = True) -> None:
        child = self._children.get(job_id)
        if child is None:
            return
        if block:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(timeout=5)
        if child.poll() is not None:
            del self._children[job_id]
