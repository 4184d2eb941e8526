"""Infrastructure faults: flaky backend calls are retried and surfaced; a worker killed
from outside is `lost` and rerun once, a second loss is a crash with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

import pytest
from common import deterministic_repo, ledger, processes_under, start_run, wait_until
from gates import HOLD, job_tree
from helpers import config_text, make_repo

from ratchet.backends.local import LocalBackend
from ratchet.driver import jobs as jobs_module
from ratchet.driver.study import Study, StudyError


class FlakyBackend:
    """The real local backend, whose named calls raise the first N times they are made."""

    def __init__(self, inner: LocalBackend, failures: dict[str, int]) -> None:
        self.inner = inner
        self.failures = dict(failures)

    def __getattr__(self, name: str):
        attr = getattr(self.inner, name)
        if name not in self.failures:
            return attr

        def call(*args, **kwargs):
            if self.failures[name] > 0:
                self.failures[name] -= 1
                raise TimeoutError(f"{name}: the job server did not answer (injected)")
            return attr(*args, **kwargs)

        return call


@pytest.fixture
def fast_backoff(monkeypatch):
    monkeypatch.setattr(jobs_module, "BACKEND_BACKOFF_S", 0.05)
    monkeypatch.setattr(jobs_module, "BACKEND_TRIES", 4)


def open_study(repo, failures):
    lines, messages = [], []
    study = Study(repo, log=lines.append, progress=lambda p: messages.append(p.message))
    study.jobs._backend = FlakyBackend(LocalBackend(study.state_dir, backend=study.config.backend), failures)
    return study, lines, messages


def test_flaky_backend_calls_are_retried_and_surfaced(tmp_path, fast_backoff):
    repo = deterministic_repo(tmp_path / "r", rounds=2)
    study, lines, messages = open_study(repo, {"submit": 2, "poll": 3, "result": 1})
    try:
        study.run()
    finally:
        study.close()
    db = ledger(repo)
    cands = db.candidates()
    errors = [e for e in db.events() if e["kind"] == "backend-error"]
    recovered = [e for e in db.events() if e["kind"] == "backend-recovered"]
    db.close()
    # nothing dropped, nothing rerun: every candidate judged on its first attempt
    assert len(cands) == 4 and all(c.is_judged for c in cands)
    assert all(c.attempt == 0 and c.metric is not None for c in cands)
    assert len(errors) == 6 and recovered
    assert {json.loads(e["data"])["call"] for e in errors} == {"submit", "status", "result"}
    assert "TimeoutError" in errors[0]["data"]
    # surfaced: a warning line and the live view's message while it was being retried
    assert sum("retry" in line and "TimeoutError" in line for line in lines) == 6
    assert any("did not answer" in m for m in messages)
    assert messages[-1] == ""  # cleared once the backend answered again


def test_backend_down_for_good_stops_the_study_resumably(tmp_path, fast_backoff):
    repo = deterministic_repo(tmp_path / "r", rounds=2)
    study, _, _ = open_study(repo, {"poll": 10_000})
    with pytest.raises(StudyError, match="nothing is lost.*ratchet run"):
        try:
            study.run()
        finally:
            study.close()
    db = ledger(repo)
    assert [c.status for c in db.candidates()] == ["submitted", "submitted"]  # not dropped
    db.close()
    # the backend is back: a plain resume finishes the study without rerunning anything
    study = Study(repo)
    try:
        study.run()
    finally:
        study.close()
    db = ledger(repo)
    cands = db.candidates()
    db.close()
    assert len(cands) == 4 and all(c.is_judged and c.attempt == 0 for c in cands)


GATED_SOLUTION = HOLD + """
import os
MODE = "base"
def score():
    if MODE == "base":
        return 1.0
    if os.environ.get("RATCHET_JOB_ID") in {held!r}:
        hold(50)  # until the test opens the gate in the job's tree, or kills the job
    return {score!r}
"""


def gated_repo(path, held=(), score=0.5):
    """One candidate (c0001, MODE = "gated"); the evaluations of the jobs named in `held`
    run until the test opens their gate, so a kill lands while they run, however loaded
    the machine."""
    return make_repo(path, {
        "ratchet.toml": config_text(
            search="[search]\nparallel = 2\nrounds = 1\n",
            knobs='[tune.knobs]\n"solution.py:MODE" = { choices = ["gated"] }\n'),
        "solution.py": GATED_SOLUTION.format(held=set(held), score=score),
        "evaluate.py": "import solution\nprint(f'score: {solution.score()}')\n",
    })


def job_dir(repo, cand_id, attempt):
    return repo / ".ratchet" / "jobs" / f"demo-{cand_id}-{attempt}"


def evaluating(repo, attempt):
    """The worker of c0001's attempt, once its evaluator is running and held (its pid),
    else None."""
    jd = job_dir(repo, "c0001", attempt)
    try:
        state = json.loads((jd / "state.json").read_text())
    except (OSError, ValueError):
        return None
    held = (job_tree(repo, jd.name) / "held").exists()
    return state["pid"] if state.get("phase") == "evaluate" and held else None


def kill_worker_while_it_evaluates(repo, attempt):
    wait_until(lambda: evaluating(repo, attempt), what=f"attempt {attempt} evaluating")
    os.kill(evaluating(repo, attempt), signal.SIGKILL)  # its evaluator is held: still running


def open_gate(repo, attempt):
    with contextlib.suppress(FileNotFoundError):  # the job ended already (the bug: killed)
        (job_tree(repo, f"demo-c0001-{attempt}") / "gate").touch()


@pytest.mark.parametrize("kills", [1, 2])
def test_worker_killed_from_outside_is_rerun_once_then_crashes(tmp_path, kills):
    repo = gated_repo(tmp_path / "r", held=[f"demo-c0001-{a}" for a in range(kills)])
    driver = start_run(repo)
    for attempt in range(kills):
        kill_worker_while_it_evaluates(repo, attempt)
    _, err = driver.communicate(timeout=120)
    assert driver.returncode == 0, err
    db = ledger(repo)
    cand = db.candidate("c0001")
    events = [e["kind"] for e in db.events("c0001")]
    db.close()
    assert cand.attempt == 1 and "lost-resubmitted" in events
    if kills == 1:
        assert cand.status == "keep" and cand.metric == 0.5, cand.reasons  # the rerun counted once
    else:
        assert cand.status == "crash"
        assert "job lost 2 times" in cand.reasons
    # the killed workers' evaluators (own sessions) did not outlive them
    deadline = time.monotonic() + 10
    while processes_under(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_under(tmp_path) == []


def test_a_lost_job_of_another_study_with_the_same_ids_leaves_ours_running(tmp_path):
    """Two studies of tasks with the same name have the same job ids (demo-c0001-0). When
    one study's worker dies, its driver kills what that job left behind, and only that:
    the other study's evaluator of its own c0001-0, running meanwhile, is not touched and
    its candidate is judged on its score, never blamed for a crash."""
    # worse than the base: plain discards, no confirmation to wait for
    held = ["demo-c0001-0", "demo-c0001-1"]
    ours = gated_repo(tmp_path / "ours", held, score=2.0)
    theirs = gated_repo(tmp_path / "theirs", held, score=2.0)
    ours_driver = start_run(ours)
    theirs_driver = None
    try:
        wait_until(lambda: evaluating(ours, 0), what="our c0001 evaluating")
        theirs_driver = start_run(theirs)
        kill_worker_while_it_evaluates(theirs, 0)
        # their driver saw the loss, killed that job's leftovers and ran it again
        wait_until(lambda: evaluating(theirs, 1), what="their rerun evaluating")
        open_gate(ours, 0)
        open_gate(theirs, 1)
        for driver in (ours_driver, theirs_driver):
            _, err = driver.communicate(timeout=120)
            assert driver.returncode == 0, err
    finally:
        for driver in (ours_driver, theirs_driver):
            if driver is not None and driver.poll() is None:
                driver.kill()
                driver.wait()
    db = ledger(ours)
    mine = db.candidate("c0001")
    db.close()
    assert mine.attempt == 0 and mine.metric == 2.0, mine.reasons  # judged, not crashed
    db = ledger(theirs)
    rerun = db.candidate("c0001")
    db.close()
    assert rerun.attempt == 1 and rerun.metric == 2.0, rerun.reasons
