"""The shell backend against fake engine CLIs (tests/backends/fakes) that really run jobs.

The fakes keep state in a directory, run the job command in the background (so the
real worker runs the real evaluator), and misbehave on purpose: the first submit /
list / status call fails, new ids appear late, and one job vanishes (node died).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tasks import check_holdout_everywhere, make_task, run_study, summary

from ratchet.backends import make_backend
from ratchet.backends.shell import load_shell_config
from ratchet.core.config import ConfigError
from ratchet.driver.config import load_config
from ratchet.driver.study import Study, StudyError

FAKES = Path(__file__).parent / "fakes"

PRESET_VARS = {
    "slurm": "",
    "vessl": 'vars = { image = "python:3.11", resource = "cpu-small" }',
    "skypilot": 'vars = { accelerators = "null" }',
}


@pytest.fixture
def engine(tmp_path, monkeypatch):
    state = tmp_path / "engine"
    state.mkdir()
    monkeypatch.setenv("FAKE_ENGINE_DIR", str(state))
    monkeypatch.setenv("PATH", f"{FAKES}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("RATCHET_TEST_SLEEP", "0.3")

    def configure(**cfg):
        (state / "config.json").write_text(json.dumps(cfg))

    configure.state = state
    return configure


def calls(state: Path) -> list[dict]:
    path = state / "calls.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def shell_section(tmp_path: Path, preset: str, **extra: str) -> str:
    lines = [
        "[backend.shell]",
        f'preset = "{preset}"',
        f'stage_dir = "{tmp_path / "stage"}"',
        f'data_dir = "{tmp_path / "shared-data"}"',
        f'python = "{sys.executable}"',
        PRESET_VARS[preset],
    ]
    values = {"poll": "0.25", "id_wait": "20", "call_timeout": "20",
              "gone_grace": "1", **extra}
    lines += [f"{k} = {v}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.slow  # 20-30 s each side by side
@pytest.mark.parametrize("preset", ["slurm", "vessl", "skypilot"])
def test_study_runs_to_completion_on_each_preset(tmp_path, engine, preset):
    engine(fail_first=["submit", "status", "list"], id_delay=2, lose=["c0002"])
    # five candidates beside the baseline, however the rounds fall (a round beside a
    # keep's confirmation holds K - 2)
    repo = make_task(tmp_path, backend="shell", parallel=3, rounds=5, sleep=0.3,
                     extra=shell_section(tmp_path, preset) + "\n[budget]\ncandidates = 5\n")
    started = time.monotonic()
    study = Study(repo)
    try:
        study.run()
    finally:
        study.close()
    took = time.monotonic() - started
    rows = summary(repo)
    assert len(rows) == 6, rows
    statuses = {cid: status for cid, status, _, _ in rows}
    assert set(statuses.values()) <= {"keep", "discard"}, statuses
    # metrics are the deterministic function of the knob
    for _, _, metric, content in rows:
        x = int(content.split("=")[1])
        assert metric == (x - 7) ** 2 + 1
    study = Study(repo)
    try:
        cands = {c.id: c for c in study.ledger.candidates()}
        # the vanished job was rerun once, under attempt 1; nothing else was rerun
        assert cands["c0002"].attempt == 1
        assert all(c.attempt == 0 for cid, c in cands.items() if cid != "c0002")
        # prepared once, shared read-only, seen by every job
        assert all(c.extra.get("data_ok") == 1 for c in cands.values())
        data_dir = Path(study.ledger.get("data_dir"))
        assert data_dir.parent.parent == tmp_path / "shared-data"
        assert len(list((tmp_path / "shared-data").iterdir())) == 1
        # queue wait and run time reach the ledger
        assert all(c.run_s and c.run_s > 0.25 for c in cands.values())
        assert all(c.queue_s is not None and c.queue_s >= 0 for c in cands.values())
    finally:
        study.close()
    # the candidates' jobs (confirmation pairs, tiny-r*, are jobs of their own):
    # 6 jobs + 1 rerun of the lost one + 1 failed first call (retried)
    submits = [c for c in calls(engine.state) if c["verb"] == "submit"
               and any(a.startswith("tiny-c") for a in c["argv"])]
    assert len(submits) == 8, [c["argv"][:4] for c in submits]
    # every job ran the pinned commit's snapshot, staged as a tarball
    staged = list((tmp_path / "stage").glob("tiny-c*/snapshot.tar"))
    assert len(staged) == 7
    assert took < 300  # no hang on the lost job (a loaded 2-core machine took 118 s)


def test_lost_job_is_retried_once_then_recorded(tmp_path, engine):
    # every attempt of c0001 vanishes: retried once, then recorded as a crash
    engine(lose=["c0001-0", "c0001-1"])
    repo = make_task(tmp_path, backend="shell", parallel=2, rounds=1, sleep=0.1, prep=False,
                     extra=shell_section(tmp_path, "slurm"))
    study = Study(repo)
    try:
        study.run()
        cand = study.ledger.candidate("c0001")
        assert cand.status == "crash"
        assert cand.attempt == 1
        assert "lost 2 times" in (cand.reasons or "")
    finally:
        study.close()


def test_queue_timeout_is_recorded_as_crash(tmp_path, engine):
    engine(pending_s=3600)
    repo = make_task(tmp_path, backend="shell", parallel=1, rounds=1, sleep=0.1, prep=False,
                     extra=shell_section(tmp_path, "slurm", queue_timeout='"1s"'))
    study = Study(repo)
    try:
        with pytest.raises(StudyError, match="baseline failed: queue timeout"):
            study.run()
        cand = study.ledger.candidate("c0000")
        assert cand.status == "crash"
        assert "queue timeout" in cand.reasons
        assert cand.attempt == 0  # not retried: ratchet stopped it on purpose
    finally:
        study.close()
    assert any(c["tool"] == "scancel" for c in calls(engine.state))


def test_driver_restart_reattaches_without_resubmitting(tmp_path, engine):
    repo = make_task(tmp_path, backend="shell", parallel=1, rounds=1, sleep=1.5, prep=False,
                     extra=shell_section(tmp_path, "slurm"))
    study = Study(repo)
    study.ensure_started()
    cands = study._propose_round(1)
    job_id = study.submit(cands[0])
    study.close()  # the driver "dies" with the job running
    backend = make_backend("shell", repo / ".ratchet", load_config(repo).backend)
    spec = Study(repo).job_spec(cands[0])
    assert backend.submit(spec) == job_id  # reattached
    deadline = time.monotonic() + 30
    while backend.status(job_id) != "done":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert backend.result(job_id).metric == 37
    assert len([c for c in calls(engine.state) if c["verb"] == "submit"]) == 1
    # the engine log carries the candidate's output prefixed, the worker's marker last
    logs = backend.logs(job_id)
    assert "| RATCHET-WORKER-RESULT" in logs  # the evaluator's forged line, neutralised
    assert logs.strip().splitlines()[-1].startswith("RATCHET-WORKER-RESULT: {")


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"backend\.shell\.preset: unknown preset"):
        load_shell_config({"preset": "pbs", "stage_dir": "/tmp/x"})
    with pytest.raises(ConfigError, match=r"backend\.shell\.stage_dir"):
        load_shell_config({"preset": "slurm"})
    with pytest.raises(ConfigError, match=r"backend\.shell\.sbmit: unknown key"):
        load_shell_config({"preset": "slurm", "stage_dir": "/tmp/x", "sbmit": "x"})
    with pytest.raises(ConfigError, match=r"backend\.shell\.states\.X"):
        load_shell_config({"preset": "slurm", "stage_dir": "/tmp/x", "states": {"X": "bad"}})
    cfg = load_shell_config({"preset": "slurm", "stage_dir": "/tmp/x",
                             "vars": {"sbatch_args": "--gres=gpu:1"}})
    assert cfg.vars["sbatch_args"] == "--gres=gpu:1"
    assert cfg.states["COMPLETED"] == "succeeded"


def test_poll_asks_the_engine_once_per_tick(tmp_path, engine):
    engine(no_accounting=True)
    repo = make_task(tmp_path, backend="shell", parallel=3, rounds=1, sleep=0.5, prep=False,
                     extra=shell_section(tmp_path, "slurm", poll="0.01"))
    study = Study(repo)
    try:
        study.ensure_started()
        cands = study._propose_round(1)
        specs = [study.job_spec(c) for c in cands]
    finally:
        study.close()
    backend = make_backend("shell", repo / ".ratchet", load_config(repo).backend)
    ids = [backend.submit(spec) for spec in specs]
    assert len(ids) == 3
    ticks, deadline = 0, time.monotonic() + 60
    while True:
        states = backend.poll(ids)
        ticks += 1
        if all(s == "done" for s in states.values()):
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.2)
    asked = [c for c in calls(engine.state) if c["tool"] == "squeue" and c["verb"] == "status"]
    assert 1 <= len(asked) <= ticks  # one squeue per tick for all three jobs
    assert all("--me" in c["argv"] for c in asked)
    # a job that left the queue with its result in its log is finished: no sacct at all
    assert not [c for c in calls(engine.state) if c["tool"] == "sacct"]
    for job_id in ids:
        result = backend.result(job_id)
        assert result.outcome == "ok" and result.metric is not None


def test_accounting_disabled_is_an_answer_not_a_retry_storm(tmp_path, engine):
    # a job vanishes with its node on a Slurm without accounting: sacct says so once,
    # the study goes on (the job is rerun), and nothing is retried serially
    engine(no_accounting=True, lose=["c0001-0"])
    repo = make_task(tmp_path, backend="shell", parallel=2, rounds=1, sleep=0.3, prep=False,
                     extra=shell_section(tmp_path, "slurm"))
    study = Study(repo)
    try:
        study.run()
        cands = {c.id: c for c in study.ledger.candidates()}
    finally:
        study.close()
    assert cands["c0001"].attempt == 1 and cands["c0001"].status in ("keep", "discard")
    assert len([c for c in calls(engine.state) if c["tool"] == "sacct"]) == 1
    log = (repo / ".ratchet/shell/backend.log").read_text()
    assert "accounting storage is disabled" in log
    assert "retrying" not in log


def test_holdout_only_for_the_would_be_keep_and_unreadable_elsewhere(tmp_path, engine,
                                                                     monkeypatch):
    engine(no_accounting=True)
    check_holdout_everywhere(tmp_path, monkeypatch, backend="shell", records=".ratchet/shell/jobs",
                             extra=shell_section(tmp_path, "slurm"), name="hold",
                             scan=(tmp_path / "stage",))
    # the staged copy went with its job: no hold-out data left in the stage directory
    assert not list((tmp_path / "stage").rglob("holdout.tar"))


def test_preparing_the_data_leaves_the_drivers_other_children_running(tmp_path, engine):
    """The shared data is prepared in the driver's own process (the shell backend's
    `data_dir`), which may have other children meanwhile: a proposer's agent CLI asked
    while the baseline runs, a server it started. Preparing used to end by killing every
    descendant of the process (what the worker, a subreaper of candidate code alone,
    does), so those died with it."""
    beside = subprocess.Popen(["sleep", "120"], start_new_session=True)  # ours, not prep's
    try:
        repo = make_task(tmp_path, backend="shell", parallel=1, rounds=1, sleep=0.1,
                         extra=shell_section(tmp_path, "slurm"))
        cands = run_study(repo)
        assert cands and all(c.extra.get("data_ok") == 1 for c in cands)  # it was prepared
        assert beside.poll() is None, f"the driver's other child was killed ({beside.returncode})"
    finally:
        beside.kill()
        beside.wait()
