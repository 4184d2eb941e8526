"""The driver half of the Ray and shell backends: what the driver does around a job that
runs `python -m ratchet.job.node` on the engine's node (job/node.py): the environment it may
forward, the hold-out archive shipped with a hold-out follow-up job only, data prepared once
in a shared location, and reading the sealed result back out of an engine's log.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from ratchet.job.jobspec import JobResult, JobSpec
from ratchet.job.node import PREP_MARKER, prep_into

# set by the engine on the job's machine: the driver's value must never replace it
ENGINE_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def forward_env(spec: JobSpec) -> None:
    """Driver side: what the candidate may see of the driver's environment (task.env
    names, RATCHET_* settings; never secrets) travels in the spec, as on local jobs."""
    from ratchet.backends.local import forwarded_env

    passed = {k: v for k, v in forwarded_env(spec).items() if k not in ENGINE_ENV}
    spec.env_set = {**passed, **spec.env_set}


def holdout_tar(spec: JobSpec, dest: Path) -> bool:
    """Driver side: pack the hold-out data for a hold-out follow-up job (only for one:
    no other job ever carries it). False when there is nothing to ship."""
    if not spec.holdout_only or not spec.holdout_dir or not Path(spec.holdout_dir).is_dir():
        return False
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-cf", str(dest), "-C", spec.holdout_dir, "."], check=True,
                   capture_output=True)
    dest.chmod(0o600)
    return True


def shared_prep(root: Path, key: str, *, repo: Path, pinned_commit: str, command: str,
                env_allow: list[str], timeout_s: float, here: bool) -> tuple[str, str] | None:
    """Prepared data in a location every node sees: reused when its manifest is there,
    else prepared on this machine when `here`; None means the engine must prepare it."""
    manifest = root / key / "manifest.json"
    if manifest.is_file():  # visible here too: nothing to do
        return str(root / key / "data"), json.loads(manifest.read_text())["digest"]
    if not here:
        return None
    from ratchet.job import gitrepo  # driver side only: nodes never come here

    with tempfile.TemporaryDirectory(prefix="ratchet-prep-") as tmp:
        gitrepo.archive_to(repo, pinned_commit, Path(tmp) / "work")
        data, digest = prep_into(root, key, command, Path(tmp) / "work", env_allow, timeout_s)
    return str(data), digest


def parse_prep_output(text: str) -> dict | None:
    for line in reversed(text.splitlines()):
        if line.startswith(PREP_MARKER):
            return json.loads(line[len(PREP_MARKER):])
    return None


def parse_result(text: str, key: bytes | None, job_id: str) -> JobResult | None:
    """The worker's result from an engine log: only an unprefixed marker line sealed with the
    job's key counts (a line a candidate got into the log, or a guessed one, does not)."""
    if key is None:
        return None
    try:
        return JobResult.from_output(text, key, job_id)
    except (ValueError, TypeError, KeyError):
        return None
