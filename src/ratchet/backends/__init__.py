"""Backends place jobs and hand back ids; they know nothing about metrics.

The same verbs for every place a job can run (after submitit / Ray's job SDK):
`submit(spec) -> id`, `status(id)`, `result(id)`, `logs(id)`, `cancel(id)`.
A new engine is one class extending `Backend` (backends/base.py).
"""

from __future__ import annotations

from pathlib import Path

from ratchet.backends.base import Backend, BackendError, JobState

__all__ = ["Backend", "BackendError", "JobState", "make_backend"]


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
