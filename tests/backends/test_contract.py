"""One contract, every backend: the same checks over local, the fake Slurm engine and Ray.

A backend is anything extending `ratchet.backends.Backend`; the study relies on exactly
these behaviours and nothing else (it never asks which backend it has):
- `submit` returns the spec's id at once and is idempotent: a second submit of the same
  spec places nothing new (a resumed driver reattaches this way);
- `poll` answers for every id asked; a job ends `done` with the worker's result, the
  evaluator's metric in it and the candidate's output never in the result channel;
- `logs` returns text; `cancel` stops a running job, which then never reports `ok`;
- the hooks have sane values (`max_attempts`, `holdout_in_job`, `describe`).
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest
from tasks import make_task

from ratchet.backends import Backend
from ratchet.driver.study import Study

FAKES = Path(__file__).parent / "fakes"
HANG = 12  # the task's evaluator sleeps an hour for X = 12


def _local(tmp_path, monkeypatch, request) -> tuple[str, str]:  # noqa: ARG001
    return "local", ""


def _slurm(tmp_path, monkeypatch, request) -> tuple[str, str]:  # noqa: ARG001
    from test_shell import shell_section

    state = tmp_path / "engine"
    state.mkdir()
    monkeypatch.setenv("FAKE_ENGINE_DIR", str(state))
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    return "shell", shell_section(tmp_path, "slurm")


def _ray(tmp_path, monkeypatch, request) -> tuple[str, str]:  # noqa: ARG001
    from test_ray import ray_section

    cluster = request.getfixturevalue("ray_cluster")
    return "ray", ray_section(tmp_path, cluster, sandbox="none")


ENGINES = [pytest.param(_local, id="local"), pytest.param(_slurm, id="slurm-fake"),
           pytest.param(_ray, id="ray", marks=pytest.mark.ray)]


def job_of(study: Study, x: int):
    """A recorded candidate setting X, and its job spec (the study's own)."""
    study.ensure_started()
    from ratchet.job import gitrepo

    pinned = study.ledger.get("pinned")
    commit = gitrepo.commit_files(study.repo, pinned, {"knob.py": f"X = {x}\n".encode()},
                                  f"X = {x}")
    cand = study.ledger.new_candidate(1, kind="candidate", parent=pinned, commit_sha=commit,
                                      description=f"X = {x}", status="committed")
    return cand, study.job_spec(cand)


def wait_state(backend: Backend, job_id: str, states: set[str], timeout: float = 90) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = backend.poll([job_id])[job_id]
        if state in states:
            return state
        time.sleep(0.1)
    raise AssertionError(f"{job_id} never reached {states}")


@pytest.mark.parametrize("engine", ENGINES)
def test_backend_contract(tmp_path, monkeypatch, request, engine):
    kind, extra = engine(tmp_path, monkeypatch, request)
    monkeypatch.setenv("RATCHET_TEST_SLEEP", "0.3")
    repo = make_task(tmp_path / kind, backend=kind, parallel=2, rounds=1, prep=False,
                     hang=HANG, name=f"contract-{uuid.uuid4().hex[:6]}", extra=extra)
    study = Study(repo)
    try:
        backend = study.backend
        assert isinstance(backend, Backend)
        assert backend.describe() and isinstance(backend.describe(), str)
        assert backend.max_attempts >= 1 and isinstance(backend.holdout_in_job, bool)

        cand, spec = job_of(study, 3)
        job_id = backend.submit(spec)
        assert job_id == spec.job_id
        assert backend.submit(spec) == job_id  # idempotent: placed once
        other, hang = job_of(study, HANG)
        hang_id = backend.submit(hang)
        states = backend.poll([job_id, hang_id])
        assert set(states) == {job_id, hang_id}
        assert all(s in ("pending", "running", "done", "lost") for s in states.values())

        assert wait_state(backend, job_id, {"done", "lost"}) == "done"
        result = backend.result(job_id)
        assert result is not None and result.outcome == "ok", result
        assert result.metric == (3 - 7) ** 2 + 1
        assert "forged" not in result.to_json()  # the evaluator's fake marker line
        assert isinstance(backend.logs(job_id), str)

        wait_state(backend, hang_id, {"running"})
        backend.cancel(hang_id)
        end = wait_state(backend, hang_id, {"done", "lost"}, timeout=60)
        if end == "done":
            stopped = backend.result(hang_id)
            assert stopped is None or stopped.outcome != "ok", stopped
        del cand, other
    finally:
        study.close()
