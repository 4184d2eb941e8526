"""The Ray backend: a front over two ways of running jobs on a Ray cluster.

- `mode = "actors"` (default, ray_actors.py): long-lived slot actors, one per slot,
  each holding its GPUs/CPUs and running one job at a time through the trusted worker.
  Placing a job is one actor call; polling is one call per actor per tick. Needs the
  cluster's GCS address (`cluster`, default "auto") and this machine able to join as a
  Ray driver (same Ray and Python versions).
- `mode = "job"` (ray_jobs.py): one Ray Job per job (Jobs API, `address` of the job
  server): full isolation per candidate, a Ray job driver's start-up per candidate.

Both keep ratchet's deterministic job ids (a restarted driver reattaches), ratchet's
deadlines (queue timeout, task.timeout + grace) and the hold-out as a follow-up job that
alone carries the hold-out data.

The cluster's nodes must be able to run `python -m ratchet.worker`: install ratchet in
the cluster's Python (or point `python` at an interpreter that has it).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from ratchet.backends import Backend, JobState
from ratchet.backends.engine import RecordStore, validate
from ratchet.config import Duration
from ratchet.jobspec import JobResult, JobSpec

if TYPE_CHECKING:
    from ratchet.backends.ray_actors import RayActors
    from ratchet.backends.ray_jobs import RayJobs


class RayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: str = Field(default="actors", pattern="^(actors|job)$")
    cluster: str = "auto"  # actors: the GCS address (host:port), "auto" or ray://...
    address: str = "http://127.0.0.1:8265"  # job: the job server (dashboard) URL
    slots: int | None = Field(default=None, ge=1)  # actors: default = what the cluster fits
    idle_exit: Duration = 900.0  # actors: a slot with no driver and no job leaves after this
    num_gpus: float | None = Field(default=None, ge=0)  # per job; Ray sets CUDA_VISIBLE_DEVICES
    num_cpus: float | None = Field(default=1, ge=0)
    memory_gb: float | None = Field(default=None, gt=0)
    resources: dict[str, float] = {}
    queue_timeout: Duration = 3600.0  # PENDING longer than this: stopped, recorded as crash
    retries: int = Field(default=1, ge=0, le=10)  # reruns of a job lost to infrastructure
    runtime_env: dict[str, Any] = {}  # merged into each job's / actor's runtime_env
    python: str = "python"  # the interpreter on the nodes that has ratchet installed
    data_uri: str | None = None  # shared path every node mounts, prepared once
    prep: str = Field(default="engine", pattern="^(engine|local)$")
    request_timeout: Duration = 30.0  # each call to the cluster
    call_attempts: int = Field(default=1, ge=1)  # job: tries per call (the study retries)
    backoff: Duration = 0.5
    poll: Duration = 0.1  # ask about a job at most this often (actors: one call per slot)


def check_shared_prep(nodes: int) -> None:
    """Prepared data without `data_uri` lives in this machine's cache, which only a
    single-node cluster sees: refuse before anything runs rather than have every job
    rejected for "modified" data it could not find."""
    if nodes > 1:
        from ratchet.prep import PrepError

        raise PrepError(f"[prep] on a Ray cluster of {nodes} nodes needs [backend.ray] "
                        "data_uri (a path every node mounts): this machine's prep cache is "
                        "not on the other nodes")


class RayBackend(Backend):
    """Delegates every verb and hook to the configured mode."""

    name = "ray"

    def __init__(self, state_dir: Path, backend_config=None) -> None:
        raw = getattr(backend_config, "ray", None) or {}
        self.cfg: RayConfig = validate(RayConfig, raw, "backend.ray")  # type: ignore[assignment]
        store = RecordStore(state_dir / "ray")
        if self.cfg.mode == "job":
            from ratchet.backends.ray_jobs import RayJobs

            self.mode: RayJobs | RayActors = RayJobs(self.cfg, store)
        else:
            from ratchet.backends.ray_actors import RayActors

            self.mode = RayActors(self.cfg, store)
        self.store = store
        self.max_attempts = self.cfg.retries + 1

    def describe(self) -> str:
        return self.mode.describe()

    def job_dir(self, job_id: str) -> Path | None:
        return self.mode.job_dir(job_id)

    def submit(self, spec: JobSpec) -> str:
        return self.mode.submit(spec)

    def status(self, job_id: str) -> JobState:
        return self.mode.status(job_id)

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        return self.mode.poll(job_ids)

    def result(self, job_id: str) -> JobResult | None:
        return self.mode.result(job_id)

    def logs(self, job_id: str) -> str:
        return self.mode.logs(job_id)

    def cancel(self, job_id: str) -> None:
        self.mode.cancel(job_id)

    def close(self) -> None:
        self.mode.close()

    def warm_up(self) -> None:
        self.mode.warm_up()

    def prepare(self, *, study: str, repo: Path, command: str, pinned_commit: str,
                key: str, env_allow: list[str], timeout_s: float) -> tuple[str, str] | None:
        if not self.cfg.data_uri:
            check_shared_prep(self.node_count())
        return self.mode.prepare(study=study, repo=repo, command=command,
                                 pinned_commit=pinned_commit, key=key, env_allow=env_allow,
                                 timeout_s=timeout_s)

    def node_count(self) -> int:
        """Alive nodes in the cluster."""
        return self.mode.node_count()
