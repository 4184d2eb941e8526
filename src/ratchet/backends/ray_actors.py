"""The Ray backend's default mode: long-lived slot actors run the jobs (driver side).

Per study, `slots` detached actors named `slot-<i>` in a namespace of the study's own
(kept in `.ratchet/ray/namespace`, so a restarted driver finds them): Ray places each
one (its `num_gpus` / `num_cpus` / `resources`, CUDA_VISIBLE_DEVICES set by Ray), and
each runs one job at a time through the trusted worker (ray_slots.SlotRunner). A job
costs one actor call to place and shares one call per actor per tick to poll, instead
of a Ray job driver per candidate.

- ids: ratchet's deterministic job id; the record (written before the job is placed)
  names the slot, and the actor keeps jobs by id, so a restarted driver reattaches and a
  repeated submit places nothing new.
- a slot actor that died (its node died) loses its jobs: `lost`, rerun by the study.
- `close()` removes the idle actors at the end of a study; an actor with a running job
  stays for the next driver, and leaves by itself after `idle_exit` without any driver.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from ratchet.backends import Backend, BackendError, JobState
from ratchet.backends.engine import (
    JobRecord,
    RecordStore,
    add_engine_queue,
    overdue,
    stopped_result,
)
from ratchet.backends.ray_settings import RayConfig, check_shared_prep
from ratchet.backends.remote import forward_env, holdout_tar
from ratchet.core.vocab import Outcome
from ratchet.job.jobspec import JobResult, JobSpec
from ratchet.job.node import HOLDOUT_TAR
from ratchet.job.ray_slots import SlotRunner


class RayActors(Backend):
    name = "ray"

    def __init__(self, cfg: RayConfig, store: RecordStore) -> None:
        self.cfg = cfg
        self.store = store
        self.namespace = self._namespace(store.root.parent)
        # the ray module and its handles, imported when first needed (ray is optional);
        # Ray's handles are dynamic (`actor.method.remote(...)`), so they are typed Any
        self._ray: Any = None
        self._owns_ray = False
        self._runner: Any = None  # ray.remote(SlotRunner)
        self._actors: dict[str, Any] = {}
        self._load: dict[str, int] | None = None  # slot -> our unfinished jobs there
        self._seen: dict[str, tuple[float, JobState]] = {}
        self._submits: dict[str, object] = {}  # job id -> its submit call, until answered
        self._lock = threading.RLock()  # connecting and creating actors: one thread at once
        self.max_attempts = cfg.retries + 1

    def describe(self) -> str:
        gpus = f"{self.cfg.num_gpus:g} GPU" if self.cfg.num_gpus else "no GPU"
        return (f"ray: {self.cfg.cluster} (slot actors, {gpus}, {self.cfg.num_cpus or 0:g} "
                f"CPU each; namespace {self.namespace})")

    def job_dir(self, job_id: str) -> Path:
        return self.store.dir(job_id)

    # -- the cluster and the slot actors ---------------------------------------------------

    @staticmethod
    def _namespace(root: Path) -> str:
        path = root / "namespace"
        with contextlib.suppress(OSError):
            return path.read_text().strip()
        root.mkdir(parents=True, exist_ok=True)
        name = f"ratchet-{uuid.uuid4().hex[:12]}"
        path.write_text(name)
        return name

    def _connect(self):
        if self._ray is not None:
            return self._ray
        with self._lock:
            return self._connect_once()

    def _connect_once(self):
        if self._ray is not None:
            return self._ray
        loopback = self.cfg.cluster.split("://")[-1].rsplit(":", 1)[0] in (
            "127.0.0.1", "localhost", "[::1]")
        if loopback:
            # Ray swaps a loopback address for this machine's first interface unless told
            # not to; a loopback-only cluster (a test cluster) is then unreachable
            os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
        import ray

        if loopback:  # read at call time; fixed at import if ray was imported before
            import ray._private.ray_constants as ray_constants

            ray_constants.ENABLE_RAY_CLUSTER = False

        if not ray.is_initialized():
            # ours to shut down at close(): a driver left connected to a cluster that
            # later stops is ended by Ray itself (exit 1), whatever else the process does
            self._owns_ray = True
            try:
                ray.init(address=self.cfg.cluster, namespace=self.namespace,
                         logging_level=logging.WARNING, log_to_driver=False)
            except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError...
                raise BackendError(f"ray: cannot connect to the cluster at "
                                   f"{self.cfg.cluster!r} ([backend.ray] cluster): {exc}") \
                    from None
        self._ray = ray
        self._runner = ray.remote(SlotRunner)
        return ray

    def _slot_names(self) -> list[str]:
        if self.cfg.slots:
            count = self.cfg.slots
        else:  # as many as the cluster holds at once
            ray = self._connect()
            total = ray.cluster_resources()
            if self.cfg.num_gpus:
                count = int(total.get("GPU", 0) // self.cfg.num_gpus)
            else:
                count = int(total.get("CPU", 1) // (self.cfg.num_cpus or 1))
            count = max(1, min(count, 256))
        return [f"slot-{i}" for i in range(count)]

    def _actor(self, slot: str, create: bool = True):
        actor = self._actors.get(slot)
        if actor is not None:
            return actor
        with self._lock:
            return self._actor_once(slot, create)

    def _actor_once(self, slot: str, create: bool):
        actor = self._actors.get(slot)
        if actor is not None:
            return actor
        ray = self._connect()
        try:
            actor = ray.get_actor(slot, namespace=self.namespace)
        except ValueError:
            if not create:
                return None
            options = dict(
                name=slot, namespace=self.namespace, lifetime="detached",
                get_if_exists=True, max_concurrency=4, max_restarts=0,
                num_cpus=self.cfg.num_cpus or 0, num_gpus=self.cfg.num_gpus or 0,
            )
            if self.cfg.memory_gb:
                options["memory"] = int(self.cfg.memory_gb * (1 << 30))
            if self.cfg.resources:
                options["resources"] = dict(self.cfg.resources)
            env = {k: v for k, v in self.cfg.runtime_env.items() if k != "working_dir"}
            if env:
                options["runtime_env"] = env
            actor = self._runner.options(**options).remote(slot, self.cfg.python,
                                                          self.cfg.idle_exit)
        self._actors[slot] = actor
        return actor

    def _get(self, refs, what: str):
        """One round of calls, with the request timeout; raises BackendError on trouble."""
        ray = self._ray
        try:
            return ray.get(refs, timeout=self.cfg.request_timeout)
        except ray.exceptions.GetTimeoutError:
            raise BackendError(f"ray {what}: no answer within "
                               f"{self.cfg.request_timeout:g}s") from None

    def warm_up(self) -> None:
        """Connect and ask Ray for the slot actors now (they and their standby workers
        start while the study makes its first proposals). Connecting happens here, on
        the calling thread: Ray's driver wants the main thread."""
        for slot in self._slot_names():
            self._actor(slot)  # creation is asynchronous on Ray's side

    # -- verbs ------------------------------------------------------------------------------

    def _loads(self) -> dict[str, int]:
        if self._load is None:  # a new driver: count what earlier drivers placed
            self._load = {s: 0 for s in self._slot_names()}
            for path in self.store.root.iterdir() if self.store.root.is_dir() else []:
                record = self.store.get(path.name)
                if record and record.engine_id in self._load and \
                        self.store.cached_result(path.name) is None:
                    self._load[record.engine_id] += 1
        return self._load

    def submit(self, spec: JobSpec) -> str:
        job_id = spec.job_id
        if self.store.cached_result(job_id) is not None:
            return job_id
        record = self.store.get(job_id)
        if record is not None and record.engine_id and \
                (self.store.dir(job_id) / "spec.json").is_file():
            # placed before (perhaps by a driver since killed): poll() asks the slot, and
            # places it again from the saved spec only if the slot never got it
            return job_id
        slot = record.engine_id if record and record.engine_id else self._pick()
        self._place(spec, slot)
        self._seen.pop(job_id, None)
        return job_id

    def _pick(self) -> str:
        loads = self._loads()
        return min(loads, key=lambda s: (loads[s], s))

    def _place(self, spec: JobSpec, slot: str) -> None:
        spec.slots, spec.slot_lock_dir = [], None
        forward_env(spec)
        record = JobRecord(spec.job_id, slot, time.time(), timeout_s=spec.timeout_s)
        path = self.store.dir(spec.job_id)
        self.store.put(record)  # write-ahead: names the slot for a restarted driver
        spec.write(path / "spec.json")  # to place it again if the slot never got it
        snapshot = _git_archive(Path(spec.repo or "."), spec.commit)
        holdout = None
        with tempfile.TemporaryDirectory(prefix="ratchet-holdout-") as tmp:
            if holdout_tar(spec, Path(tmp) / HOLDOUT_TAR):  # the hold-out job only
                holdout = (Path(tmp) / HOLDOUT_TAR).read_bytes()
        actor = self._actor(slot)
        # not awaited: an actor Ray cannot place yet (no free GPU) leaves the job
        # pending, which poll() reports and ratchet's queue timeout bounds
        key = self.store.keys.create(spec.job_id)  # the result comes back sealed with it
        self._submits[spec.job_id] = actor.submit.remote(spec.job_id, spec.to_json(),
                                                         snapshot, holdout, key.hex())
        loads = self._loads()
        loads[slot] = loads.get(slot, 0) + 1

    def status(self, job_id: str) -> JobState:
        return self.poll([job_id])[job_id]

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        """One call per slot actor for all its jobs; results come back with the answer."""
        now = time.monotonic()
        states: dict[str, JobState] = {}
        by_slot: dict[str, list[tuple[str, JobRecord]]] = {}
        for job_id in job_ids:
            seen = self._seen.get(job_id)
            record = self.store.get(job_id)
            if self.store.cached_result(job_id) is not None:
                states[job_id] = JobState.DONE
            elif seen and now - seen[0] < self.cfg.poll:
                states[job_id] = seen[1]
            elif record is None or not record.engine_id:
                states[job_id] = JobState.LOST
            else:
                by_slot.setdefault(record.engine_id, []).append((job_id, record))
        if not by_slot:
            return states
        ray = self._connect()
        dead = self._settle_submits([j for jobs in by_slot.values() for j, _ in jobs])
        refs = {}
        for slot, jobs in by_slot.items():
            if any(job_id in self._submits for job_id, _ in jobs):
                continue  # the slot has not taken its job yet (not placed by Ray yet)
            actor = self._actor(slot, create=False)
            if actor is None:
                dead.add(slot)
            elif slot not in dead:
                refs[slot] = actor.poll.remote([j for j, _ in jobs])
        answers = {}
        for slot, ref in refs.items():
            try:
                answers[slot] = self._get(ref, f"poll {slot}")
            except ray.exceptions.RayActorError:
                self._actors.pop(slot, None)
                dead.add(slot)
        finished: dict[str, list[str]] = {}
        for slot, jobs in by_slot.items():
            for job_id, record in jobs:
                if slot in dead:
                    states[job_id] = self._lost(record, f"slot actor {slot} died")
                    continue
                answer = answers.get(slot, {}).get(job_id) if slot in answers else \
                    {"state": JobState.PENDING}
                if answer is None:
                    states[job_id] = self._unknown(job_id, record, slot)
                elif answer["state"] == JobState.DONE:
                    states[job_id] = self._finish(record, answer)
                    finished.setdefault(slot, []).append(job_id)
                else:
                    reason = overdue(record, answer["state"], self.cfg.queue_timeout,
                                     self.store, time.time())
                    states[job_id] = (self._stop(record, reason) if reason
                                      else JobState(answer["state"]))
                self._seen[job_id] = (now, states[job_id])
        for slot, done in finished.items():  # fire and forget: free the slot's memory
            self._actors[slot].forget.remote(done)
            if self._load is not None:
                self._load[slot] = max(0, self._load.get(slot, 0) - len(done))
        return states

    def _settle_submits(self, job_ids: list[str]) -> set[str]:
        """Collect answered submit calls. A submit that met a dead actor (one that left
        after `idle_exit`, or lost its node) never ran: it goes to a fresh actor under
        the same id. Returns nothing dead: that is for polls to find."""
        ray = self._ray
        waiting = {self._submits[j]: j for j in job_ids if j in self._submits}
        if not waiting:
            return set()
        ready, _ = ray.wait(list(waiting), num_returns=len(waiting), timeout=0)
        for ref in ready:
            job_id = waiting[ref]
            del self._submits[job_id]
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError:
                record = self.store.get(job_id)
                path = self.store.dir(job_id) / "spec.json"
                if record and record.engine_id and path.is_file():
                    self._actors.pop(record.engine_id, None)
                    self.store.note(f"{job_id}: slot {record.engine_id} was gone; placed "
                                    "again on a fresh one")
                    self._place(JobSpec.from_json(path.read_text()), record.engine_id)
        return set()

    def _finish(self, record: JobRecord, answer: dict) -> JobState:
        logs = answer.get("logs") or ""
        key = self.store.keys.get(record.job_id)
        try:  # only what the job's worker sealed is its result
            worker = JobResult.from_sealed(answer["result"], key, record.job_id) if key else None
        except (KeyError, ValueError, TypeError):
            worker = None
        if record.stop_reason:
            self.store.cache_result(record.job_id, stopped_result(record, worker), logs)
            return JobState.DONE
        if worker is None:
            return self._lost(record, "the slot reported no result")
        self.store.cache_result(record.job_id, add_engine_queue(worker, record), logs)
        return JobState.DONE

    def _unknown(self, job_id: str, record: JobRecord, slot: str) -> JobState:
        """The slot does not know the job: the driver died before placing it, or the
        actor is a new one (the old one exited). Place it again from the saved spec."""
        path = self.store.dir(job_id) / "spec.json"
        if record.stop_reason or not path.is_file():
            return self._lost(record, f"slot {slot} does not know the job")
        self._place(JobSpec.from_json(path.read_text()), slot)
        self.store.note(f"{job_id}: not on {slot}; placed again under the same id")
        return JobState.PENDING

    def _lost(self, record: JobRecord, why: str) -> JobState:
        if record.stop_reason:
            self.store.cache_result(record.job_id, stopped_result(record, None))
            return JobState.DONE
        record.lost = why
        self.store.put(record)
        self.store.note(f"{record.job_id}: lost: {why}")
        return JobState.LOST

    def _stop(self, record: JobRecord, reason: str) -> JobState:
        record.stop_reason, record.stop_outcome = reason, Outcome.TIMEOUT
        self.store.put(record)
        self.store.note(f"{record.job_id}: {reason}")
        actor = self._actors.get(record.engine_id) if record.engine_id else None
        if actor is not None:
            actor.cancel.remote(record.job_id)
        self.store.cache_result(record.job_id, stopped_result(record, None))
        return JobState.DONE

    def result(self, job_id: str) -> JobResult | None:
        return self.store.cached_result(job_id)

    def logs(self, job_id: str) -> str:
        path = self.store.dir(job_id) / "engine.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def cancel(self, job_id: str) -> None:
        record = self.store.mark_cancelled(job_id)
        if record is None:
            return
        actor = self._actor(record.engine_id, create=False) if record.engine_id else None
        if actor is not None:  # not awaited: an actor not placed yet answers never
            actor.cancel.remote(job_id)

    def close(self) -> None:
        """End of a study: remove the idle slot actors; one with a job keeps running."""
        if self._ray is None:
            return
        ray = self._ray
        asked = {slot: actor.busy.remote() for slot, actor in self._actors.items()}
        ready, _ = ray.wait(list(asked.values()), num_returns=len(asked), timeout=5)
        for slot, ref in asked.items():
            with contextlib.suppress(Exception):
                actor = self._actors[slot]
                if ref not in ready:  # never placed by Ray (waiting for a GPU): not needed
                    ray.kill(actor)
                elif ray.get(ref) == 0:  # idle: leaves and removes its files
                    actor.shutdown.remote()
                else:
                    continue
                self._actors.pop(slot)
        if self._owns_ray:
            self._owns_ray = False
            self._ray = None
            ray.shutdown()

    # -- prepared data ------------------------------------------------------------------

    def node_count(self) -> int:
        ray = self._connect()
        return sum(1 for node in ray.nodes() if node.get("Alive"))

    def prepare(self, *, study: str, repo: Path, command: str, pinned_commit: str,
                key: str, env_allow: list[str], timeout_s: float) -> tuple[str, str] | None:
        """One Ray task prepares into the shared `data_uri` (atomic; reused if there)."""
        from ratchet.backends.remote import shared_prep
        from ratchet.job.prep import PrepError

        if not self.cfg.data_uri:
            check_shared_prep(self.node_count())
            return None  # the driver's cache: right for a single-node cluster
        root = self.cfg.data_uri.removeprefix("file://")
        ready = shared_prep(Path(root), key, repo=repo, pinned_commit=pinned_commit,
                            command=command, env_allow=env_allow, timeout_s=timeout_s,
                            here=self.cfg.prep == "local")
        if ready is not None:
            return ready

        ray = self._connect()
        # no CPU reserved: the slot actors may hold them all, and prep runs once
        task = ray.remote(_prep_task).options(num_cpus=0, max_retries=0)
        snapshot = _git_archive(repo, pinned_commit)
        ref = task.remote(root, key, command, snapshot, env_allow, timeout_s)
        try:
            out = ray.get(ref, timeout=self.cfg.queue_timeout + timeout_s + 60)
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            raise PrepError("prep task on the Ray cluster did not finish in time; "
                            "stopped") from None
        except ray.exceptions.RayError as exc:
            raise PrepError(f"prep task on the Ray cluster failed: {exc}") from None
        if "error" in out:
            raise PrepError(out["error"])
        return out["data_dir"], out["digest"]


def _git_archive(repo: Path, commit: str) -> bytes:
    from ratchet.job import gitrepo

    proc = subprocess.run(gitrepo.git_argv(repo, "archive", "--format=tar", commit),
                          capture_output=True, check=False, env=gitrepo.git_env())
    if proc.returncode != 0:
        raise BackendError(f"git archive {commit[:12]}: {proc.stderr.decode().strip()}")
    return proc.stdout


def _prep_task(root: str, key: str, command: str, snapshot: bytes, env_allow: list[str],
               timeout_s: float) -> dict:
    """Runs on a node: unpack the pinned snapshot, prepare once into root/key."""
    import shutil

    from ratchet.job.node import prep_into
    from ratchet.job.prep import PrepError

    scratch = Path(tempfile.mkdtemp(prefix="ratchet-prep-"))
    try:
        work = scratch / "work"
        work.mkdir()
        subprocess.run(["tar", "-x", "-C", str(work)], input=snapshot, check=True,
                       capture_output=True)
        data, digest = prep_into(Path(root), key, command, work, env_allow, timeout_s)
        return {"data_dir": str(data), "digest": digest}
    except PrepError as exc:
        return {"error": str(exc)}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
