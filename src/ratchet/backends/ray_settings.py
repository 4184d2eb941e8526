"""The Ray backend's settings (`[backend.ray]`) and the check both of its modes make
before anything runs: below ray.py (which chooses the mode) and the two modes
(ray_actors.py, ray_jobs.py), which all read them.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
