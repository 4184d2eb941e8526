"""kill -9 of the driver at 20 points of multi-round studies, resumed each time (two
studies of 10 kills, each with every crash hook), each compared with one uninterrupted run.

The points are the places where a crash is hardest to survive (between a decision and
the record of it: RATCHET_FAULT crash hooks in study.py and the local backend) plus
SIGKILLs from outside at seeded moments. The end state must equal an uninterrupted run
of the same deterministic task.

A kill from outside lands a seeded number of ledger events into the run, not a number
of seconds: on a fast, idle machine a timed kill let a run get so far that the study
ended before the last kill (19 kills of 20). Counted in events, each run makes the same
bounded progress on any machine, and the kill still lands wherever the driver happens
to be between two records.
"""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest
from common import deterministic_repo, ledger, start_run, wait_no_processes
from helpers import git, job_result, results_tsv

from ratchet.job.jobspec import RESULT_MARKER

LABELS = ["proposed", "recorded", "submit-recorded", "spawned", "submitted",
          "result-recorded", "verdicts", "judged"]
KILLS = 10  # per study; two studies (seeds) make the 20 points
ROUNDS = 24  # the study must outlive all 10 kills (rounds got faster)
SETTINGS = 100  # more settings of X than the study tries: the tuner never repeats one


def schedule(seed: int = 20240607) -> list[tuple[str, int]]:
    """Every crash hook at least once, the rest a seeded mix of hooks and outside kills
    ("events", n: SIGKILL once the run has written n more ledger events)."""
    rng = random.Random(seed)
    nth = lambda: 1 if rng.random() < 0.7 else 2  # noqa: E731
    plan = [(label, nth()) for label in LABELS]
    while len(plan) < KILLS:
        if rng.random() < 0.45:
            plan.append(("events", rng.randint(1, 12)))
        else:
            plan.append((rng.choice(LABELS), nth()))
    rng.shuffle(plan)
    return plan


def _events(repo: Path) -> int:
    """Events recorded in the ledger so far (0 before there is one), read-only."""
    path = repo / ".ratchet" / "ledger.db"
    if not path.exists():
        return 0
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
        try:
            return db.execute("SELECT COUNT(*) FROM events").fetchone()[0]
        finally:
            db.close()
    except sqlite3.OperationalError:  # the table is being created: nothing yet
        return 0


def kill_after_events(repo: Path, proc: subprocess.Popen, n: int) -> None:
    """SIGKILL `proc` from outside once it has recorded `n` more events."""
    target = _events(repo) + n
    deadline = time.monotonic() + 60
    while proc.poll() is None and _events(repo) < target and time.monotonic() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)


def outcome(repo) -> dict:
    """What an uninterrupted run and a resumed one must agree on."""
    db = ledger(repo)
    try:
        cands = db.candidates()
        incumbent_id = db.get("incumbent_id")
        return {
            "candidates": [(c.round, c.kind, json.dumps(c.params, sort_keys=True), c.status,
                            c.metric) for c in cands],
            "incumbent_metric": db.get("incumbent_metric"),
            "incumbent_params": db.candidate(incumbent_id).params,
            "branch_solution": git(repo, "show", "ratchet/demo:solution.py"),
        }
    finally:
        db.close()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    """The outcome of the task run once without a kill: both seeds' studies must end there
    (the task is deterministic, so one run serves both)."""
    # enough rounds that the study is still running at the 10th kill, however fast it is
    reference = deterministic_repo(tmp_path_factory.mktemp("reference") / "repo", rounds=ROUNDS,
                                   settings=SETTINGS)
    done = start_run(reference)
    _, err = done.communicate(timeout=180)
    assert done.returncode == 0, err
    expected = outcome(reference)
    assert len(expected["candidates"]) == 2 * ROUNDS  # K = 2, baseline included
    return expected


@pytest.mark.slow
@pytest.mark.parametrize("seed", [20240607, 20240608])
def test_driver_killed_at_20_points_resumes_to_the_same_result(tmp_path, seed, uninterrupted):
    expected = uninterrupted
    repo = deterministic_repo(tmp_path / "faulted", rounds=ROUNDS, settings=SETTINGS)
    killed = []
    for label, arg in schedule(seed):
        if label == "events":
            proc = start_run(repo)
            kill_after_events(repo, proc, arg)
        else:
            proc = start_run(repo, RATCHET_FAULT=f"{label}:{arg}")
        _, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, err
        if proc.returncode == -signal.SIGKILL:
            killed.append(f"{label}:{arg}")
        else:
            assert proc.returncode == 0, err
    # every hook fired at least once, and the study was still running at each kill
    assert {k.split(":")[0] for k in killed} >= set(LABELS), killed
    assert len(killed) == KILLS, killed

    final = start_run(repo)
    _, err = final.communicate(timeout=180)
    assert final.returncode == 0, err

    # no orphan: every worker and candidate process is gone
    assert wait_no_processes(tmp_path) == []

    got = outcome(repo)
    assert got == expected, (killed, got, expected)

    db = ledger(repo)
    cands = db.candidates()
    try:
        # every candidate recorded exactly once: one row per (round, params), contiguous ids
        assert [c.seq for c in cands] == list(range(len(cands)))
        keys = [(c.round, json.dumps(c.params, sort_keys=True)) for c in cands]
        assert len(set(keys)) == len(keys)
        commits = [c.commit_sha for c in cands if c.kind == "candidate"]
        assert len(set(commits)) == len(commits)
        # no job was ever counted lost (the driver's death is not the job's)
        assert all(c.attempt == 0 for c in cands), [(c.id, c.attempt) for c in cands]
        assert not [e for e in db.events() if e["kind"] in ("lost", "lost-resubmitted")]
        # no finished result lost, no job run twice: one job dir per candidate, one worker
        # run in it, and the ledger holds exactly what that worker reported
        jobs = repo / ".ratchet" / "jobs"
        # a would-be keep's confirmation pairs (rows r0001, ...) are jobs of their own
        rows = db.candidates(confirmations=True)
        assert all(c.attempt == 0 for c in rows), [(c.id, c.attempt) for c in rows]
        assert sorted(p.name for p in jobs.iterdir()) == sorted(c.job_id for c in rows)
        for cand in rows:
            log = (jobs / cand.job_id / "worker.log").read_text()
            assert log.count(RESULT_MARKER) == 1, (cand.id, log)
            assert job_result(repo, cand.job_id)["metric"] == cand.metric
        # every candidate keeps its ref; the incumbent was judged keep
        for cand in cands:
            if cand.kind == "candidate":
                ref = f"refs/ratchet/demo/{cand.id}"
                assert git(repo, "rev-parse", ref) == cand.commit_sha
        incumbent = db.candidate(db.get("incumbent_id"))
        assert incumbent.status == "keep"
        assert git(repo, "rev-parse", "ratchet/demo") == db.get("incumbent") \
            == incumbent.commit_sha
        assert [r["status"] for r in results_tsv(repo)] == [c.status for c in cands]
    finally:
        db.close()


ROLLING_BUDGET = 24


def rolling_schedule(seed: int = 7) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    plan = [(label, 1 if rng.random() < 0.7 else 2) for label in LABELS]
    plan += [("events", rng.randint(1, 12)) for _ in range(3)]
    rng.shuffle(plan)
    return plan


@pytest.mark.slow
def test_rolling_driver_killed_at_every_boundary_keeps_its_guarantees(tmp_path):
    """Rolling search has no fixed order to compare with a reference run; what must
    hold is the same: nothing lost, nothing counted twice, no job run twice, and the
    incumbent is the best keep, on the branch."""
    repo = deterministic_repo(tmp_path / "rolling", rounds=1)
    budget = {"RATCHET_TEST_CANDIDATES": str(ROLLING_BUDGET)}
    killed = []
    for label, arg in rolling_schedule():
        if label == "events":
            proc = start_run(repo, rolling=True, **budget)
            kill_after_events(repo, proc, arg)
        else:
            proc = start_run(repo, rolling=True, RATCHET_FAULT=f"{label}:{arg}", **budget)
        _, err = proc.communicate(timeout=120)
        assert "Traceback" not in err, err
        if proc.returncode == -signal.SIGKILL:
            killed.append(f"{label}:{arg}")
        else:
            assert proc.returncode == 0, err
    assert {k.split(":")[0] for k in killed} >= set(LABELS), killed
    final = start_run(repo, rolling=True, **budget)
    _, err = final.communicate(timeout=180)
    assert final.returncode == 0, err
    assert wait_no_processes(tmp_path) == []

    db = ledger(repo)
    try:
        cands = db.candidates()
        # the budget counts candidates that ran (a repeat is recorded, unrun, on top)
        assert sum(c.kind == "candidate" and c.job_id is not None
                   for c in cands) == ROLLING_BUDGET
        assert [c.seq for c in cands] == list(range(len(cands)))
        assert all(c.is_judged for c in cands), [(c.id, c.status) for c in cands]
        commits = [c.commit_sha for c in cands if c.kind == "candidate"]
        assert len(set(commits)) == len(commits)
        assert all(c.attempt == 0 for c in cands), [(c.id, c.attempt) for c in cands]
        assert not [e for e in db.events() if e["kind"] in ("lost", "lost-resubmitted")]
        jobs = repo / ".ratchet" / "jobs"
        # a proposal repeating an earlier candidate's files is rejected unrun: no job
        assert all(c.job_id or c.status == "rejected" for c in cands)
        recorded, cands = cands, [c for c in cands if c.job_id]
        # a would-be keep's confirmation pairs (rows r0001, ...) are jobs of their own
        cands += [r for r in db.candidates(confirmations=True) if r.confirms]
        assert all(c.attempt == 0 for c in cands), [(c.id, c.attempt) for c in cands]
        assert sorted(p.name for p in jobs.iterdir()) == sorted(c.job_id for c in cands)
        for cand in cands:
            log = (jobs / cand.job_id / "worker.log").read_text()
            assert log.count(RESULT_MARKER) == 1, (cand.id, log)
            assert job_result(repo, cand.job_id)["metric"] == cand.metric
            if cand.kind == "candidate":  # the incumbent it started from is recorded
                assert git(repo, "rev-parse", f"{cand.commit_sha}^") == cand.parent
                assert git(repo, "rev-parse", f"refs/ratchet/demo/{cand.id}") == \
                    cand.commit_sha
        # every keep beat the incumbent of its time; the last keep is the incumbent
        keeps = sorted((c for c in cands if c.status == "keep"), key=lambda c: c.judged_at)
        assert all(b.metric < a.metric for a, b in zip(keeps, keeps[1:], strict=False))
        incumbent = db.candidate(db.get("incumbent_id"))
        assert incumbent.id == keeps[-1].id
        assert git(repo, "rev-parse", "ratchet/demo") == db.get("incumbent") \
            == incumbent.commit_sha
        assert [r["status"] for r in results_tsv(repo)] == [c.status for c in recorded]
    finally:
        db.close()
