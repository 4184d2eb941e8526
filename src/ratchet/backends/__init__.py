"""Backends place jobs and hand back ids; they know nothing about metrics.

The same verbs for every place a job can run (after submitit / Ray's job SDK):
`submit(spec) -> id`, `status(id)`, `result(id)`, `logs(id)`, `cancel(id)`.
A new engine is one class implementing `Backend`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Protocol

from ratchet.jobspec import JobResult, JobSpec

# pending: queued / waiting for a slot; running; done: the worker reported a result;
# lost: the job is gone without a result (infrastructure fault; may be retried once).
JobState = Literal["pending", "running", "done", "lost"]


class Backend(Protocol):
    name: str

    def submit(self, spec: JobSpec) -> str:
        """Place the job; return its id at once. Idempotent for the same spec.job_id."""
        ...

    def status(self, job_id: str) -> JobState: ...

    def result(self, job_id: str) -> JobResult | None:
        """The worker's result once status is 'done' (never the candidate's output)."""
        ...

    def logs(self, job_id: str) -> str: ...

    def cancel(self, job_id: str) -> None: ...

    def job_dir(self, job_id: str) -> Path | None:
        """Where this job's logs live on this machine, if anywhere."""
        ...

    def close(self) -> None: ...

    def describe(self) -> str: ...


class BackendError(Exception):
    """An infrastructure problem talking to the engine (retried by the caller)."""


def make_backend(kind: str, state_dir: Path, config) -> Backend:
    if kind == "local":
        from ratchet.backends.local import LocalBackend

        return LocalBackend(state_dir, config.backend)
    if kind == "ray":
        from ratchet.backends.ray import RayBackend

        return RayBackend(state_dir, config.backend)
    if kind == "shell":
        from ratchet.backends.shell import ShellBackend

        return ShellBackend(state_dir, config.backend)
    raise ValueError(f"backend.kind: unknown backend {kind!r} (expected local, ray or shell)")
