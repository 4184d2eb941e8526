"""The one base class every backend extends: the verbs, and explicit default hooks.

A backend places jobs and hands back ids; it knows nothing about metrics. The study
talks to every backend through this class only: it never asks which backend it has,
and never probes for optional parts. What differs between engines is a hook below with
a default that is right for most of them (after Optuna's `BaseSampler`).

Retries have one owner. A backend applies its own timeouts and raises `BackendError`
(or any exception) when the engine does not answer; the study (`Jobs.call`) retries the
call with backoff and reports it. A backend never retries a failing call itself; the
one wait a backend owns is for an engine to show what it already did (shell's
`id_wait`: a job's id appearing in a listing), within its own deadline.
"""

from __future__ import annotations

import abc
import contextlib
import os
import shutil
from pathlib import Path

from ratchet.core.errors import InfrastructureError
from ratchet.core.vocab import JobState  # pending | running | done | lost
from ratchet.job.jobspec import JobResult, JobSpec


class BackendError(InfrastructureError):
    """An infrastructure problem talking to the engine (retried by the study)."""


class Backend(abc.ABC):
    """Where jobs run. Subclasses implement the verbs; the hooks have safe defaults."""

    name: str = "backend"

    # A job lost to infrastructure (never one that failed on its own) is run at most
    # this many times in all.
    max_attempts: int = 2

    # False: the hold-out runs as a follow-up job, only for the candidate about to be
    # kept, and a failure there is `rejected` (overfit). True: every job also evaluates
    # the hold-out (an engine that cannot run follow-up jobs).
    holdout_in_job: bool = False

    # -- the verbs (submitit / Ray job SDK) ------------------------------------------------

    @abc.abstractmethod
    def submit(self, spec: JobSpec) -> str:
        """Place the job; return its id at once. Idempotent for the same spec.job_id."""

    @abc.abstractmethod
    def status(self, job_id: str) -> JobState: ...

    @abc.abstractmethod
    def result(self, job_id: str) -> JobResult | None:
        """The worker's result once status is 'done' (never the candidate's output)."""

    @abc.abstractmethod
    def logs(self, job_id: str) -> str: ...

    @abc.abstractmethod
    def cancel(self, job_id: str) -> None: ...

    @abc.abstractmethod
    def job_dir(self, job_id: str) -> Path | None:
        """Where this job's records and logs live on this machine, if anywhere."""

    @abc.abstractmethod
    def describe(self) -> str: ...

    def close(self) -> None:
        """Release what the backend holds (clients, idle workers); running jobs stay."""
        return None

    # -- hooks with defaults ---------------------------------------------------------------

    def poll(self, job_ids: list[str]) -> dict[str, JobState]:
        """The state of many jobs. Default: one `status` call each; an engine that can
        answer for all jobs in one call (squeue, list_jobs) overrides this."""
        return {job_id: self.status(job_id) for job_id in job_ids}

    def warm_up(self) -> None:
        """Called once before the first job: start what makes later jobs start fast."""
        return None

    def phase(self, job_id: str) -> str | None:
        """The phase a running job is in (build, smoke, run, evaluate, holdout), for the
        live view; None when the engine cannot tell (the default)."""
        return None

    def prepare(self, *, study: str, repo: Path, command: str, pinned_commit: str,
                key: str, env_allow: list[str], timeout_s: float) -> tuple[str, str] | None:
        """Run `[prep]` where every node sees it: (data dir, digest), or None to use the
        driver's local prep cache (right when jobs run on this machine)."""
        return None

    def sandbox_mode(self, setting: str) -> str:
        """The sandbox the worker must use. Default: the setting as written, decided on
        the job's machine; a backend running jobs here resolves it once (`auto`)."""
        return setting

    def unreachable(self, spec: JobSpec) -> str | None:
        """Before the first job: why the sandbox could not start the job's untrusted
        parties as their uid (the one line of `ratchet.job.reach.probe`), or None.
        Default: None, the jobs run elsewhere; their workers ask the same when a party
        dies at its start, and the result says so."""
        return None

    def work_dirs(self, job_id: str) -> list[Path]:
        """Directories of a finished job on this machine that clean-up may delete (its
        work tree, temp files); logs and results are kept. Default: none here."""
        return []

    def holdout_workdir(self, job_id: str) -> str | None:
        """Where a hold-out follow-up job finds the candidate's built work tree, or None
        when the follow-up job materialises the candidate again. Every backend here says
        None: the tree the candidate ran in is the candidate's (a `ratchet/__init__.py` or
        an `opt_einsum.py` it planted there would be imported by the hold-out evaluator),
        so the hold-out starts from the commit's files and the pinned ones, built afresh."""
        return None

    def clean_up(self, job_id: str) -> None:
        """Free the disk a judged job used (`backend.keep_workdirs` decides which)."""
        for path in self.work_dirs(job_id):
            if path.is_dir():
                shutil.rmtree(path, onerror=_force_remove)


def _force_remove(func, path, exc_info) -> None:  # noqa: ARG001
    """rmtree helper: a candidate may leave read-only files and directories behind."""
    with contextlib.suppress(OSError):
        os.chmod(os.path.dirname(path), 0o755)
        os.chmod(path, 0o755)
        func(path)
