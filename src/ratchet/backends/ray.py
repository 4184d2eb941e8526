"""The Ray backend: two ways of running jobs on a Ray cluster; `ray_backend` returns
the configured one itself.

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

The cluster's nodes must be able to run `python -m ratchet.job.worker`: install ratchet in
the cluster's Python (or point `python` at an interpreter that has it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ratchet.backends import Backend, register_backend
from ratchet.backends.engine import RecordStore
from ratchet.core.config import Backend as BackendSection
from ratchet.core.config import Duration


class RayConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["actors", "job"] = "actors"
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
    prep: Literal["engine", "local"] = "engine"
    request_timeout: Duration = 30.0  # each call to the cluster (the study retries)
    poll: Duration = 0.1  # ask about a job at most this often (actors: one call per slot)


def check_shared_prep(nodes: int) -> None:
    """Prepared data without `data_uri` lives in this machine's cache, which only a
    single-node cluster sees: refuse before anything runs rather than have every job
    rejected for "modified" data it could not find."""
    if nodes > 1:
        from ratchet.job.prep import PrepError

        raise PrepError(f"[prep] on a Ray cluster of {nodes} nodes needs [backend.ray] "
                        "data_uri (a path every node mounts): this machine's prep cache is "
                        "not on the other nodes")


@register_backend("ray", settings=RayConfig,
                  summary="a Ray cluster: slot actors (mode = actors) or one Ray Job per job")
def ray_backend(state_dir: Path, settings: RayConfig, backend: BackendSection) -> Backend:
    """The configured mode's backend itself: RayActors or RayJobs (no front forwarding
    the verbs, so every hook a mode overrides reaches the study)."""
    del backend  # everything Ray needs is in [backend.ray]
    store = RecordStore(state_dir / "ray")
    if settings.mode == "job":
        from ratchet.backends.ray_jobs import RayJobs

        return RayJobs(settings, store)
    from ratchet.backends.ray_actors import RayActors

    return RayActors(settings, store)
