"""The Ray backend on a real, private local Ray cluster (2 CPUs, 2 logical GPUs).

Each study gets its own name: the cluster outlives the studies within a session.
Default mode: slot actors; `mode = "job"`: one Ray Job per job.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from tasks import check_holdout_everywhere, make_task, run_study, summary

from ratchet.driver.study import Study, StudyError

pytestmark = pytest.mark.ray
RATCHET = [str(Path(sys.executable).parent / "ratchet")]


def ray_section(tmp_path: Path, cluster: dict, sandbox: str | None = None,
                **extra: str) -> str:
    values = {"cluster": f'"{cluster["gcs"]}"', "address": f'"{cluster["address"]}"',
              "python": f'"{sys.executable}"', "num_gpus": "1", "num_cpus": "0",
              "poll": "0.1", "data_uri": f'"{tmp_path / "shared-data"}"', **extra}
    head = f'sandbox = "{sandbox}"\n' if sandbox else ""  # (in [backend])
    return head + "[backend.ray]\n" + "".join(f"{k} = {v}\n" for k, v in values.items())


def records(repo: Path) -> dict[str, dict]:
    root = repo / ".ratchet/ray/jobs"
    return {p.name: json.loads((p / "record.json").read_text())
            for p in root.iterdir() if (p / "record.json").exists()} if root.exists() else {}


def submission_ids(address: str, study: str) -> list[str]:
    from ray.job_submission import JobSubmissionClient

    return [j.submission_id for j in JobSubmissionClient(address).list_jobs()
            if (j.submission_id or "").startswith(f"{study}-")]


def test_study_on_ray_survives_a_killed_driver_and_matches_local(tmp_path, ray_cluster):
    study_name = f"tiny-{uuid.uuid4().hex[:6]}"
    trace = tmp_path / "trace.txt"
    # eight candidates beside the baseline however the rounds fall (the round after a
    # keep holds K - 2: its confirmation pair takes two slots)
    budget = "\n[budget]\ncandidates = 8\n"
    repo = make_task(tmp_path / "ray", backend="ray", parallel=3, rounds=8, sleep=1.5,
                     name=study_name, extra=ray_section(tmp_path, ray_cluster,
                                                        sandbox="none") + budget)
    # (no sandbox: under bubblewrap the evaluator could not write the trace)
    env = {**os.environ, "RATCHET_TEST_TRACE": str(trace)}
    # 1. run the driver as a real process and SIGKILL it while jobs run on slot actors
    driver = subprocess.Popen([*RATCHET, "run"], cwd=repo, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True, start_new_session=True,
                              env=env)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and not (trace.exists() and
                                               "-c0001-" in trace.read_text()):
        assert driver.poll() is None, driver.stderr.read()
        time.sleep(0.1)
    running = records(repo)
    assert running, "no job was ever placed"
    os.killpg(driver.pid, signal.SIGKILL)
    driver.wait()
    # 2. rerun: it finds the study's slot actors and its jobs by id, and finishes
    again = subprocess.run([*RATCHET, "run"], cwd=repo, capture_output=True, text=True,
                           timeout=300, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    # the candidates' jobs; confirmation pairs (-r0001-0, ...) are jobs of their own, each
    # recorded and run exactly once too
    expected = sorted(f"{study_name}-c{n:04d}-0" for n in range(9))
    pairs = sorted(j for j in records(repo) if j.startswith(f"{study_name}-r"))
    assert sorted(records(repo)) == sorted(expected + pairs)
    runs = trace.read_text().split()
    assert sorted(runs) == sorted(expected + pairs), runs  # every job ran exactly once
    ray_rows = summary(repo)
    assert all(status in ("keep", "discard") for _, status, _, _ in ray_rows), ray_rows

    # 3. GPU scheduling: at most 2 jobs at once, each with its own CUDA_VISIBLE_DEVICES
    study = Study(repo)
    try:
        cands = study.ledger.candidates()
    finally:
        study.close()
    spans = [(c.extra["t_start"], c.extra["t_end"], c.extra["cuda"]) for c in cands]
    assert all(cuda in (0.0, 1.0) for _, _, cuda in spans)
    for start, _, _ in spans:  # at every job's start: who runs at that instant
        running = [s for s in spans if s[0] <= start < s[1]]
        assert len(running) <= 2, running
        assert len({s[2] for s in running}) == len(running), running
    assert all(c.extra["data_ok"] == 1 for c in cands)
    assert all(c.run_s and c.run_s >= 1.5 for c in cands)
    assert all(c.queue_s is not None for c in cands)

    # 4. the study's slot actors are gone at its end (nothing left holding the GPUs)
    from ray.util.state import list_actors

    namespace = (repo / ".ratchet/ray/namespace").read_text().strip()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = [a for a in list_actors(address=ray_cluster["address"], limit=10000)
                if a.ray_namespace == namespace and a.state != "DEAD"]
        if not left:
            break
        time.sleep(0.5)
    assert not left, left

    # 5. the same deterministic task on the local backend gives the same study. The local
    # driver also restarts after round 1, like the killed one.
    local = make_task(tmp_path / "local", backend="local", parallel=3, rounds=8, sleep=0.1,
                      name=study_name, extra=budget)
    for rounds in (1, None):
        study = Study(local)
        try:
            study.run(rounds=rounds)
        finally:
            study.close()
    local_rows = summary(local)
    assert [(s, m, c) for _, s, m, c in local_rows] == [(s, m, c) for _, s, m, c in ray_rows]


@pytest.mark.parametrize("mode", ["actors", "job"])
def test_holdout_only_for_the_would_be_keep_and_unreadable_elsewhere(tmp_path, ray_cluster,
                                                                     mode, monkeypatch):
    check_holdout_everywhere(
        tmp_path, monkeypatch, backend="ray", records=".ratchet/ray/jobs",
        extra=ray_section(tmp_path, ray_cluster, mode=f'"{mode}"'),
        name=f"hold-{mode}-{uuid.uuid4().hex[:6]}")


def test_queue_timeout_and_job_timeout_are_crashes(tmp_path, ray_cluster):
    # a job that can never be placed (3 GPUs on a 2-GPU cluster) is stopped and recorded
    name = f"queue-{uuid.uuid4().hex[:6]}"
    repo = make_task(tmp_path / "q", backend="ray", parallel=1, rounds=1, prep=False,
                     name=name, extra=ray_section(tmp_path, ray_cluster, num_gpus="3",
                                                  queue_timeout='"2s"', slots="1"))
    study = Study(repo)
    try:
        with pytest.raises(StudyError, match="queue timeout"):
            study.run()
        cand = study.ledger.candidate("c0000")
        assert cand.status == "crash" and "queue timeout" in cand.reasons
        assert cand.attempt == 0
    finally:
        study.close()
    record = records(repo)[f"{name}-c0000-0"]
    assert "queue timeout" in record["stop_reason"]

    # a job past task.timeout: the worker kills the evaluator's tree; recorded as crash
    name = f"hang-{uuid.uuid4().hex[:6]}"
    repo = make_task(tmp_path / "h", backend="ray", parallel=1, rounds=1, prep=False,
                     name=name, hang=1, timeout="3s", extra=ray_section(tmp_path, ray_cluster))
    study = Study(repo)
    try:
        with pytest.raises(StudyError, match="timed out"):
            study.run()
        cand = study.ledger.candidate("c0000")
        assert cand.status == "crash" and "timed out" in cand.reasons
    finally:
        study.close()


def test_job_mode_places_one_ray_job_per_candidate(tmp_path, ray_cluster):
    name = f"jobs-{uuid.uuid4().hex[:6]}"
    repo = make_task(tmp_path, backend="ray", parallel=2, rounds=1, sleep=0.2, name=name,
                     extra=ray_section(tmp_path, ray_cluster, mode='"job"'))
    cands = run_study(repo)
    assert all(c.status in ("keep", "discard") for c in cands)
    assert all(c.extra["data_ok"] == 1 for c in cands)
    ids = submission_ids(ray_cluster["address"], name)
    # one Ray job per candidate (confirmation pairs, -r0001-..., are jobs of their own)
    assert sorted(i for i in ids if "-prep-" not in i and f"{name}-r" not in i) == \
        sorted(f"{name}-c{n:04d}-0" for n in range(len(cands)))


def test_prep_across_nodes_needs_a_shared_location():
    from ratchet.backends.ray_settings import check_shared_prep
    from ratchet.job.prep import PrepError

    check_shared_prep(1)  # a single node sees the driver's cache
    with pytest.raises(PrepError, match=r"cluster of 3 nodes needs \[backend.ray\] data_uri"):
        check_shared_prep(3)


@pytest.mark.parametrize("mode", ["actors", "job"])
def test_node_count_of_the_test_cluster(tmp_path, ray_cluster, mode):
    from ratchet.backends import make_backend
    from ratchet.driver.config import load_config

    repo = make_task(tmp_path, backend="ray", name=f"nodes-{mode}",
                     extra=ray_section(tmp_path, ray_cluster, mode=f'"{mode}"'))
    backend = make_backend("ray", repo / ".ratchet", load_config(repo).backend)
    try:
        assert backend.node_count() == 1
    finally:
        backend.close()


def test_a_slot_that_left_when_idle_is_replaced_without_losing_the_job(tmp_path, ray_cluster):
    from ratchet.backends import make_backend
    from ratchet.driver.config import load_config
    from ratchet.job.jobspec import JobSpec

    repo = make_task(tmp_path, backend="ray", parallel=1, rounds=2, sleep=0.1, prep=False,
                     name=f"idle-{uuid.uuid4().hex[:6]}",
                     extra=ray_section(tmp_path, ray_cluster, slots="1", idle_exit='"1s"'))
    study = Study(repo)
    try:
        study.ensure_started()
        first = study.job_spec(study._propose_round(1)[0])
    finally:
        study.close()
    backend = make_backend("ray", repo / ".ratchet", load_config(repo).backend)

    def run(spec):
        job_id = backend.submit(spec)
        deadline = time.monotonic() + 120
        while backend.poll([job_id])[job_id] != "done":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        return backend.result(job_id)

    try:
        assert run(first).outcome == "ok"
        time.sleep(8)  # the slot leaves: idle for longer than idle_exit, no calls
        second = JobSpec.from_json(first.to_json())
        second.job_id = f"{first.job_id}-again"
        result = run(second)
        assert result.outcome == "ok", result
        assert "placed again on a fresh one" in (repo / ".ratchet/ray/backend.log").read_text()
    finally:
        backend.close()
