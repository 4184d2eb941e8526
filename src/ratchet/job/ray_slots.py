"""The slot actor of the Ray backend's default mode (runs on the cluster's nodes).

One long-lived, detached, named Ray actor per slot holds that slot's GPUs/CPUs (Ray
places it and sets CUDA_VISIBLE_DEVICES) and runs one job at a time through the same
trusted worker as every backend (`python -m ratchet.job.worker`, a separate process in a
session of its own, started ahead as a standby so a job starts in milliseconds). The
candidate's code never runs in the actor's process.

The actor keeps each job's state by ratchet's deterministic job id, so a submit that
arrives twice (a restarted driver) places nothing new. It outlives the driver (detached)
and exits on its own when no driver has asked anything for `idle_exit` seconds and no
job runs, so a study that is never resumed does not hold GPUs forever.
"""

from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

from ratchet.core.vocab import JobState, Outcome
from ratchet.job.jobspec import JobResult, JobSpec, Slot, worker_env
from ratchet.job.seal import KEY_FILE, write_key_file

# job states as the actor reports them (JobState's words: they cross to the driver as text)
PENDING, RUNNING, DONE = JobState.PENDING, JobState.RUNNING, JobState.DONE
SPARE_DELAY_S = 0.5


class SlotRunner:
    """Wrapped with `ray.remote` by the driver (kept importable without Ray)."""

    def __init__(self, slot: str, python: str, idle_exit_s: float) -> None:
        self.slot = slot
        self.python = sys.executable if python in ("", "python") else python
        self.idle_exit_s = idle_exit_s
        self.root = Path(tempfile.mkdtemp(prefix=f"ratchet-{slot}-"))
        # others may pass through (not list): the evaluator's own uid must reach its job's
        # work tree below, as the candidate's must (mkdtemp makes it 0700)
        self.root.chmod(0o711)
        self.jobs: dict[str, dict] = {}
        self.queue: collections.deque[str] = collections.deque()
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.last_call = time.monotonic()
        self.current: subprocess.Popen | None = None
        self.spare: subprocess.Popen | None = None
        self.env = self._slot_env()
        self._start_spare()
        threading.Thread(target=self._loop, daemon=True).start()

    # -- called by the driver ----------------------------------------------------------

    def info(self) -> dict:
        self.last_call = time.monotonic()
        import socket

        return {"slot": self.slot, "host": socket.gethostname(), "pid": os.getpid(),
                "cuda": self.env.get("CUDA_VISIBLE_DEVICES"), "jobs": len(self.jobs)}

    def submit(self, job_id: str, spec_json: str, snapshot: bytes,
               holdout: bytes | None = None, key_hex: str = "") -> str:
        """Queue a job (idempotent by job id); returns its state."""
        self.last_call = time.monotonic()
        with self.lock:
            if job_id in self.jobs:
                return self.jobs[job_id]["state"]
            job_dir = self.root / job_id
            job_dir.mkdir(parents=True)
            if holdout is not None:
                (job_dir / "holdout.tar").write_bytes(holdout)
                (job_dir / "holdout.tar").chmod(0o600)
            if key_hex:  # the worker reads and deletes it before any candidate code runs
                write_key_file(job_dir / KEY_FILE, bytes.fromhex(key_hex), exclusive=True)
            self.jobs[job_id] = {"state": PENDING, "times": {"received": time.time()},
                                 "spec": spec_json, "snapshot": snapshot}
            self.queue.append(job_id)
        self.wake.set()
        return PENDING

    def poll(self, job_ids: list[str]) -> dict[str, dict]:
        """{job id: {"state": ..., "result": json?, "logs": text?}}; unknown ids are absent."""
        self.last_call = time.monotonic()
        out = {}
        with self.lock:
            for job_id in job_ids:
                job = self.jobs.get(job_id)
                if job is not None:
                    out[job_id] = {k: job[k] for k in ("state", "result", "logs", "times")
                                   if k in job}
        return out

    def forget(self, job_ids: list[str]) -> None:
        """The driver has cached these results: free their memory and disk here."""
        with self.lock:
            for job_id in job_ids:
                job = self.jobs.get(job_id)
                if job is not None and job["state"] == DONE:
                    job.pop("logs", None)
                    job.pop("result", None)
                    job["forgotten"] = True

    def cancel(self, job_id: str) -> None:
        self.last_call = time.monotonic()
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None or job["state"] == DONE:
                return
            if job["state"] == PENDING:
                with contextlib.suppress(ValueError):
                    self.queue.remove(job_id)
                result = JobResult(job_id=job_id, outcome=Outcome.CANCELLED, failed_stage="queue",
                                   reason="cancelled before it started")
                job.pop("snapshot", None)
                job.update(state=DONE, result=result.to_json(), logs="")
                return
            job["cancel"] = True
            proc = self.current
        if proc is not None:  # the worker stops its phases and reports `cancelled`
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def busy(self) -> int:
        """Jobs queued or running here."""
        self.last_call = time.monotonic()
        with self.lock:
            return sum(1 for j in self.jobs.values() if j["state"] != DONE)

    def shutdown(self) -> None:
        """End of the study: leave, taking this slot's files along (idle slots only)."""
        with self.lock:
            if any(j["state"] != DONE for j in self.jobs.values()):
                return
        self._clean()
        import ray

        ray.actor.exit_actor()  # an intended exit: Ray reports no worker failure

    # -- inside the actor ---------------------------------------------------------------

    def _slot_env(self) -> dict[str, str]:
        env = {}
        with contextlib.suppress(Exception):
            import ray

            gpus = ray.get_gpu_ids()
            if gpus:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
        if "CUDA_VISIBLE_DEVICES" not in env and "CUDA_VISIBLE_DEVICES" in os.environ:
            env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
        return env

    def _start_spare(self) -> None:
        """A worker with its interpreter up and modules imported, waiting for a job."""
        with self.lock:
            if self.spare is not None and self.spare.poll() is None:
                return  # one is waiting already
            self.spare = self._popen_spare()

    def _popen_spare(self) -> subprocess.Popen:
        return subprocess.Popen(
            [self.python, "-m", "ratchet.job.worker", "--standby"],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, cwd=self.root, env=worker_env(dict(os.environ)),
        )

    def _loop(self) -> None:
        while True:
            self.wake.wait(timeout=5.0)
            self.wake.clear()
            while True:
                with self.lock:
                    job_id = self.queue.popleft() if self.queue else None
                    if job_id is not None:
                        job = self.jobs[job_id]
                        job["state"] = RUNNING
                        spec_json, snapshot = job.pop("spec"), job.pop("snapshot")
                if job_id is None:
                    break
                self._run(job_id, spec_json, snapshot)
            if time.monotonic() - self.last_call > self.idle_exit_s and not self.queue:
                self._exit()

    def _run(self, job_id: str, spec_json: str, snapshot: bytes) -> None:
        from ratchet.job.gitrepo import GitError  # noqa: F401  (import cost paid here, once)
        from ratchet.job.node import echo_logs, place_holdout

        job_dir = self.root / job_id
        times = self.jobs[job_id]["times"]  # where a job's time goes, for the bench
        times["taken"] = time.time()
        shipped = None
        try:
            spec = JobSpec.from_json(spec_json)
            work = job_dir / "work"
            work.mkdir()
            with tarfile.open(fileobj=io.BytesIO(snapshot)) as tar:  # in memory: no fork
                tar.extractall(work, filter="tar")
            shipped = place_holdout(spec, job_dir / "holdout.tar")
            spec.repo = None
            spec.reuse_workdir = str(work)  # unpacked here: the worker materialises nothing
            spec.slots = [Slot(name=self.slot, env=dict(self.env))]
            spec.slot_lock_dir = str(self.root / "locks")
            (job_dir / "spec.json").write_text(spec.to_json())
            with self.lock:
                worker = self.spare if self.spare is not None and self.spare.poll() is None \
                    else None
                self.spare = None
            if worker is None:
                worker = subprocess.Popen(
                    [self.python, "-m", "ratchet.job.worker", str(job_dir)],
                    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True, cwd=job_dir,
                    env=worker_env(dict(os.environ)))
            else:
                assert worker.stdin is not None  # a spare is started with stdin=PIPE
                worker.stdin.write(f"{job_dir}\n".encode())
                worker.stdin.close()
            times["handed"] = time.time()
            # the next job's worker starts while this one runs (a moment later, so the
            # two interpreters do not compete for the cores at this job's start)
            threading.Timer(SPARE_DELAY_S, self._start_spare).start()
            with self.lock:
                self.current = worker
                cancelled = self.jobs[job_id].get("cancel")
            if cancelled:
                worker.send_signal(signal.SIGTERM)
            worker.wait()
            times["worker_exited"] = time.time()
            try:
                text = (job_dir / "result.json").read_text()
                json.loads(text)["mac"]  # sealed by the worker; the driver checks the seal
            except (OSError, ValueError, TypeError, KeyError):
                text = JobResult(job_id=job_id, outcome=Outcome.ERROR, failed_stage="worker",
                                 reason=f"the worker exited with code {worker.returncode} "
                                        "and reported nothing").to_json()
            logs = echo_logs(job_dir)
        except Exception as exc:  # the actor must always report, never vanish
            text = JobResult(job_id=job_id, outcome=Outcome.ERROR, failed_stage="worker",
                             reason=f"slot actor: {type(exc).__name__}: {exc}").to_json()
            logs = ""
        finally:
            if shipped is not None:
                shutil.rmtree(shipped, ignore_errors=True)
            shutil.rmtree(job_dir / "work", ignore_errors=True)
        times["stored"] = time.time()
        with self.lock:
            self.current = None
            self.jobs[job_id].update(state=DONE, result=text, logs=logs)
        self._start_spare()  # if the early one failed to start

    def _clean(self) -> None:
        if self.spare is not None:
            with contextlib.suppress(OSError):
                self.spare.kill()
        shutil.rmtree(self.root, ignore_errors=True)

    def _exit(self) -> None:
        """Idle without a driver: free the slot (the cluster's GPUs) and its files."""
        self._clean()
        os._exit(0)  # from the actor's own thread: Ray records the actor as dead
