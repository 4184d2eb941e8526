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

from ratchet.backends import Backend, register_backend
from ratchet.backends.engine import RecordStore
from ratchet.backends.ray_settings import RayConfig
from ratchet.core.config import Backend as BackendSection


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
