"""The local backend: one worker process per job on this machine, slots leased by flock.

Each job is `python -m ratchet.job.worker .ratchet/jobs/<id>` in its own session. The
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
from pydantic import BaseModel, ConfigDict

from ratchet.backends import Backend, JobState, register_backend
from ratchet.backends.spares import Spare, SpareServer, running
from ratchet.core.config import Backend as BackendSection
from ratchet.job import seal
from ratchet.job.faults import fault_point
from ratchet.job.jobspec import JOB_DIR_ENV, JobResult, JobSpec, Slot, scrub_env, worker_env


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


def usable_cores() -> list[int]:
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def split_cores(count: int, cores: list[int]) -> list[list[int]]:
    """The cores of each of `count` slots: split between them, or, with more slots than
    cores (e.g. sleep-bound tasks), one each, shared round-robin."""
    if count <= len(cores):
        return [[c for j, c in enumerate(cores) if j % count == i] for i in range(count)]
    return [[cores[i % len(cores)]] for i in range(count)]


def plan_slots(slots: int | None, gpus: list[str] | None = None) -> list[Slot]:
    """Default: one slot per GPU if any, else one per core. CPUs split between slots."""
    cores = usable_cores()
    gpus = visible_gpus() if gpus is None else gpus
    count = slots or (len(gpus) if gpus else len(cores))
    plan = []
    for i, cpus in enumerate(split_cores(count, cores)):
        env = {}
        name = f"cpu{i}"
        if gpus:
            gpu = gpus[i % len(gpus)]
            env["CUDA_VISIBLE_DEVICES"] = gpu
            name = f"gpu{gpu}" if count <= len(gpus) else f"gpu{gpu}.{i // len(gpus)}"
        env["OMP_NUM_THREADS"] = str(len(cpus))
        plan.append(Slot(name=name, env=env, cpus=cpus))
    return plan


def plan_build_slots(count: int) -> list[Slot]:
    """CPU slots for builds declared `task.build_on = "cpu"`: cores split between them,
    no GPU visible (the build said it needs none; a GPU build belongs in the job's slot)."""
    return [Slot(name=f"build{i}", cpus=cpus,
                 env={"CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": str(len(cpus))})
            for i, cpus in enumerate(split_cores(count, usable_cores()))]


def forwarded_env(spec: JobSpec) -> dict[str, str]:
    """What a candidate may see of the driver's environment beyond the basic allow-list
    (task.env names, RATCHET_* settings), minus secrets and the config's declared key
    names. Workers start from a scrubbed environment, so it travels in the spec."""
    passed = scrub_env(dict(os.environ), spec.env_allow, spec.denied_env())
    return {k: v for k, v in passed.items()
            if k in spec.env_allow or k.startswith("RATCHET_")}


class LocalSettings(BaseModel):
    """`[backend.local]`: nothing of its own yet; the local backend reads the `[backend]`
    keys every study has (slots, gpus, build_slots, standby_workers)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


@register_backend("local", settings=LocalSettings,
                  summary="this machine: one worker per job, GPU/CPU slots leased by flock")
class LocalBackend(Backend):
    name = "local"

    def __init__(self, state_dir: Path, settings: LocalSettings | None = None,
                 backend: BackendSection | None = None) -> None:
        del settings  # no keys of its own
        backend = backend or BackendSection()
        self.jobs_dir = state_dir / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)
        self.keys = seal.KeyStore(state_dir)  # each job's result key: driver and worker only
        self._keys: dict[str, bytes] = {}  # the keys read or made by this driver, by job id
        self.lock_dir = state_dir / "slots"
        self.slots = plan_slots(backend.slots, backend.gpus)
        self.build_slots = plan_build_slots(backend.build_slots)
        self._pipelined = False  # a job built on a build slot: more workers in flight
        self._children: dict[str, subprocess.Popen | Spare] = {}
        # Standby workers: forked (modules loaded) while earlier jobs run, so the next
        # round's jobs start in milliseconds instead of ~0.3 s each.
        self.standby = backend.standby_workers
        self._spares = SpareServer(self.jobs_dir, worker_env(dict(os.environ)),
                                   log=state_dir / "spares.log")

    def describe(self) -> str:
        return f"local: {len(self.slots)} slots ({', '.join(s.name for s in self.slots)})"

    def job_dir(self, job_id: str) -> Path:
        return self.jobs_dir / job_id

    # -- Backend hooks: jobs run on this machine -------------------------------------------

    def sandbox_mode(self, setting: str) -> str:
        from ratchet.job import sandbox

        return sandbox.choose(setting)  # decided once here rather than by every worker

    def unreachable(self, spec: JobSpec) -> str | None:
        """Probe as the worker would start a party: a stand-in job directory beside the
        real ones, the phases' own policy and uid. The evaluator's candidate child needs
        the same (interpreter, venv, ratchet's package, the job's tree) as another uid of
        the same kind: what one of them reaches, the other does."""
        from ratchet.job import reach
        from ratchet.job.worker import Job

        job_dir = self.jobs_dir / f".reach-{os.getpid()}"
        try:
            work = job_dir / "work"
            work.mkdir(parents=True, exist_ok=True)
            job = Job(spec, job_dir, work)
            job.on_slot(None)
            env = dict(job.env)
            policy = job.policy("build", env, None, trusted=False)
            data = [Path(spec.data_dir)] if spec.data_dir and Path(spec.data_dir).is_dir() else []
            return reach.probe(spec.sandbox, policy, reach.needed(extra=data),
                               "the candidate's phases and its evaluator's child",
                               env=env, cwd=work, trees=[work])
        finally:
            shutil.rmtree(job_dir, ignore_errors=True)

    def work_dirs(self, job_id: str) -> list[Path]:
        return [self.job_dir(job_id) / "work", self.job_dir(job_id) / "tmp",
                self.job_dir(job_id) / "data"]  # the job's private copy of prepared data

    # -- verbs ----------------------------------------------------------------------------

    def submit(self, spec: JobSpec) -> str:
        job_dir = self.job_dir(spec.job_id)
        if (self._alive(spec.job_id) or self._sealed(spec.job_id) is not None
                or (job_dir / "pid.json").exists()):
            return spec.job_id  # idempotent: already placed (a dead one is `lost`, not rerun)
        job_dir.mkdir(parents=True, exist_ok=True)
        spec.slots = self.slots
        if spec.build_on_cpu and spec.build:
            spec.build_slots = self.build_slots
            self._pipelined = True
        spec.slot_lock_dir = str(self.lock_dir)
        spec.env_set = {**forwarded_env(spec), **spec.env_set}
        spec.write(job_dir / "spec.json")
        self._place(job_dir, spec.job_id)
        return spec.job_id

    def _place(self, job_dir: Path, job_id: str) -> None:
        key = self._keys[job_id] = self.keys.create(job_id)
        spare = self._spares.take() if self.standby else None
        if spare is not None:
            # pid.json first: a driver killed before the hand-over leaves a job that never
            # started (no state.json), which status() places again under the same id
            self._write_pid(job_dir, spare.pid, spare.created)
            fault_point("spawned")
            if self._spares.assign(spare, job_dir, key):
                self._children[job_id] = spare
                return
            (job_dir / "pid.json").unlink(missing_ok=True)
            spare.kill()
        with (job_dir / "worker.log").open("ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "ratchet.job.worker", str(job_dir), "--key-stdin"],
                env=worker_env(dict(os.environ)),
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=job_dir,
            )
        with contextlib.suppress(OSError):  # the key travels on a pipe only we two hold
            assert proc.stdin is not None
            proc.stdin.write(key.hex().encode() + b"\n")
            proc.stdin.close()
        self._children[job_id] = proc
        fault_point("spawned")
        self._write_pid(job_dir, proc.pid, psutil.Process(proc.pid).create_time())

    @staticmethod
    def _write_pid(job_dir: Path, pid: int, created: float) -> None:
        (job_dir / "pid.json").write_text(json.dumps({"pid": pid, "created": created}))

    def warm_up(self) -> None:
        """Start standby workers now (the study calls this before its first round)."""
        self._top_up_spares()

    def _top_up_spares(self) -> None:
        """As many spares as jobs can start at once. A spare is a fork of a loaded server
        (about a millisecond of CPU), so it is made at once, even while jobs start."""
        if not self.standby:
            return
        # pipelined: jobs building on the CPU slots run beside those holding the slots
        wanted = len(self.slots) + (len(self.build_slots) if self._pipelined else 0)
        self._spares.request(wanted - self._spares.count())

    def status(self, job_id: str) -> JobState:
        self._top_up_spares()  # someone is waiting on jobs: the next ones will need workers
        return self._state(job_id)

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        """Every job's state, the spares topped up once per look rather than once a job."""
        self._top_up_spares()
        return {job_id: self._state(job_id) for job_id in job_ids}

    def _state(self, job_id: str) -> JobState:
        job_dir = self.job_dir(job_id)
        if self._sealed(job_id) is not None:
            self._reap(job_id, block=False)  # the worker may still be exiting: don't wait
            return JobState.DONE
        if self._alive(job_id):
            try:
                state = json.loads((job_dir / "state.json").read_text())["state"]
            except (OSError, ValueError, KeyError):
                return JobState.PENDING
            return JobState.PENDING if state == "pending" else JobState.RUNNING
        # exited: the result may have landed between our two checks
        if self._sealed(job_id) is not None:
            return JobState.DONE
        if (job_dir / "spec.json").exists() and not (job_dir / "state.json").exists():
            # placed but never started (the hand-over to a standby worker was cut off):
            # nothing ran, so placing it again under the same id is safe
            (job_dir / "pid.json").unlink(missing_ok=True)
            self._place(job_dir, job_id)
            return JobState.PENDING
        self._kill_leftovers(job_id)  # the worker died: its phase tree must not outlive it
        return JobState.LOST

    def result(self, job_id: str) -> JobResult | None:
        return self._sealed(job_id)

    def _sealed(self, job_id: str) -> JobResult | None:
        """The job's result.json, if its worker sealed it with the job's key. Anything else
        there (a candidate's daemon or another party wrote it) is not a result: the real
        worker replaces it, or the job is lost and rerun, never judged on it."""
        # the key as this driver made or first read it: keys live in the state directory,
        # which only trusted code writes (a poll reads it for every job, every look)
        key = self._keys.get(job_id) or self.keys.get(job_id)
        if key is None:
            return None
        self._keys[job_id] = key
        try:
            text = (self.job_dir(job_id) / "result.json").read_text()
            return JobResult.from_sealed(text, key, job_id)
        except (OSError, ValueError, TypeError):  # seal.Forged is a ValueError
            return None

    def phase(self, job_id: str) -> str | None:
        # the worker names the phase it starts in its state file
        try:
            return json.loads((self.job_dir(job_id) / "state.json").read_text()).get("phase")
        except (OSError, ValueError, AttributeError):
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
            from ratchet.job.procs import kill_tree

            kill_tree(pid)
        self._reap(job_id)

    def close(self) -> None:
        self._spares.close()  # idle spares exit with their server; jobs run on
        for job_id in list(self._children):
            if self._sealed(job_id) is not None:
                self._reap(job_id)  # finished: let it exit; running jobs stay detached

    # -- process bookkeeping -----------------------------------------------------------------

    def _pid(self, job_id: str) -> int | None:
        try:
            info = json.loads((self.job_dir(job_id) / "pid.json").read_text())
        except (OSError, ValueError):
            return self._find_worker(job_id)
        if not running(info["pid"], info["created"]):  # gone, a zombie, or a reused pid
            self._reap(job_id)  # a zombie of ours is collected
            return None
        return info["pid"]

    def _find_worker(self, job_id: str) -> int | None:
        """A worker whose pid.json was never written (driver killed right after spawning)."""
        job_dir = str(self.job_dir(job_id))
        if not (self.job_dir(job_id) / "spec.json").exists():
            return None  # never placed: nothing to look for
        for proc in psutil.process_iter(["cmdline", "create_time"]):
            cmdline = proc.info["cmdline"] or []
            if "ratchet.job.worker" in cmdline and job_dir in cmdline:
                with contextlib.suppress(OSError):
                    (self.job_dir(job_id) / "pid.json").write_text(json.dumps(
                        {"pid": proc.pid, "created": proc.info["create_time"]}))
                return proc.pid
        return None

    def _kill_leftovers(self, job_id: str) -> None:
        """Kill processes of a job whose worker vanished (they run in their own sessions).

        Matched on the job's directory, which the worker puts in each phase's environment:
        the job id alone is not this study's (another study of a task with the same name
        has the same ids), and matching on it killed that study's running evaluator, whose
        candidate was then blamed for a crash."""
        mine = str(self.job_dir(job_id).resolve())
        # a worker killed while it started a phase leaves that phase's tree still coming
        # up (sandbox, shell, evaluator): scan again until a scan finds none (2 s at most)
        deadline = time.monotonic() + 2.0
        while True:
            found = 0
            for proc in psutil.process_iter(["environ"]):
                with contextlib.suppress(psutil.Error):
                    if (proc.info["environ"] or {}).get(JOB_DIR_ENV) == mine:
                        proc.kill()
                        found += 1
            if not found or time.monotonic() > deadline:
                return
            time.sleep(0.05)

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
