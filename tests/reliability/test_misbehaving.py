"""Candidates that misbehave are contained, recorded with a reason, and the study goes on.

Already covered elsewhere (not repeated here): a hang killed at the timeout with its
whole tree (tests/test_worker.py), gigabytes of output capped, a memory hog stopped by
memory_limit_gb, a candidate raising an exception (tests/test_loop.py).

GPU memory needs no test of its own: every candidate runs in a fresh worker process and
fresh phase processes (one process group each, killed with its tree at the end of the
phase), so whatever a candidate allocated on a GPU is released when its processes exit,
before the slot is leased to the next candidate.
"""

from __future__ import annotations

import json
import uuid

import pytest
from common import ledger, wait_no_processes
from helpers import config_text, make_repo, ratchet

TOKEN = f"ratchet-misbehave-{uuid.uuid4().hex}"

SOLUTION = f'''
import os, shutil, signal, subprocess, sys, time

MODE = "base"
TOKEN = "{TOKEN}"


def sleeper(*, new_session=False, ignore_term=False):
    code = "import signal, time\\n"
    if ignore_term:
        code += "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
    code += "time.sleep(600)\\n"
    subprocess.Popen([sys.executable, "-c", code, TOKEN], start_new_session=new_session)


def score():
    if MODE == "ignore_term":  # a tree that ignores SIGTERM, hanging past the timeout
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        sleeper(ignore_term=True)
        sleeper(new_session=True, ignore_term=True)
        time.sleep(600)
    if MODE == "daemon":  # a classic double-fork daemon outliving a successful evaluation
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)",
                                          TOKEN])
            os._exit(0)
        sleeper()  # and a plain child left running
        return 0.5
    if MODE == "bigfile":  # fill the job directory's disk
        with open("big.bin", "wb") as fh:
            while True:
                fh.write(b"x" * (1 << 20))
    if MODE == "rmwork":  # delete its own worktree, then claim a great score
        shutil.rmtree(os.environ["RATCHET_WORKDIR"], ignore_errors=True)
        return 0.001
    if MODE == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    if MODE == "abort":
        os._exit(3)
    return 1.0
'''

EVALUATOR = "import solution\nprint(f'score: {solution.score()}')\n"
MODES = ["ignore_term", "daemon", "bigfile", "rmwork", "segfault", "abort"]


def misbehaving_repo(path, backend_extra=""):
    task = config_text().split("[task.metric]")[0].replace('timeout = "60s"', 'timeout = "4s"')
    return make_repo(path, {
        "ratchet.toml": config_text(
            task=task,
            search=f"[search]\nparallel = {len(MODES) + 1}\nrounds = 1\n",
            knobs=f'[tune.knobs]\n"solution.py:MODE" = {{ choices = {json.dumps(MODES)} }}\n',
            backend='[backend]\nkind = "local"\nslots = 2\ndisk_limit_gb = 0.01\n'
                    + backend_extra,
        ),
        "solution.py": SOLUTION,
        "evaluate.py": EVALUATOR,
    })


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    repo = misbehaving_repo(tmp_path_factory.mktemp("misbehave") / "r")
    proc = ratchet(repo, "run", timeout=180)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    db = ledger(repo)
    by_mode = {(c.params or {}).get("solution.py:MODE", "base"): c for c in db.candidates()}
    db.close()
    assert sorted(by_mode) == sorted(["base", *MODES])
    return repo, by_mode


def test_every_misbehaving_candidate_is_judged_with_a_reason(study):
    _, by_mode = study
    assert by_mode["base"].status == "keep"
    for mode in MODES:
        cand = by_mode[mode]
        assert cand.is_judged and cand.reasons, (mode, cand.status, cand.reasons)
    # the study went on: a well-behaved improvement in the same round was kept
    assert by_mode["daemon"].status == "keep", by_mode["daemon"].reasons


def test_candidate_ignoring_sigterm_is_killed_at_the_timeout(study):
    _, by_mode = study
    cand = by_mode["ignore_term"]
    assert cand.status == "crash"
    assert "timed out" in cand.reasons and "process tree killed" in cand.reasons
    assert cand.run_s < 30


def test_children_outliving_the_candidate_are_killed(study):
    assert wait_no_processes_with(TOKEN) == []


def test_filling_the_disk_stops_at_the_file_size_limit(study):
    _, by_mode = study
    cand = by_mode["bigfile"]
    assert cand.status == "crash"
    assert "file size limit" in cand.reasons, cand.reasons
    assert "disk_limit_gb = 0.01" in cand.reasons  # (the work dir is cleaned after judging)
    assert "File too large" in cand.reasons


def test_deleting_the_worktree_is_reported_not_kept(study):
    _, by_mode = study
    cand = by_mode["rmwork"]
    assert cand.status in ("crash", "rejected"), (cand.status, cand.reasons)
    assert cand.status != "keep"


def test_signals_and_abrupt_exits_are_crashes_with_the_cause(study):
    _, by_mode = study
    assert by_mode["segfault"].status == "crash"
    # a shell in between reports the signal as 128 + 11
    assert any(why in by_mode["segfault"].reasons for why in ("exit code -11", "exit code 139"))
    assert by_mode["abort"].status == "crash"
    assert "exit code 3" in by_mode["abort"].reasons


def test_no_process_is_left_behind(study):
    repo, _ = study
    assert wait_no_processes(repo) == []


def test_deleting_the_whole_job_directory_without_a_sandbox_still_reports(tmp_path):
    """Without bwrap a candidate can delete its job directory; the worker still reports."""
    solution = '''
import os, shutil
MODE = "base"
def score():
    if MODE == "rmjob":
        shutil.rmtree(os.path.dirname(os.environ["RATCHET_WORKDIR"]), ignore_errors=True)
    return 2.0 if MODE == "base" else 1.0
'''
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(
            search="[search]\nparallel = 2\nrounds = 1\n",
            knobs='[tune.knobs]\n"solution.py:MODE" = { choices = ["rmjob"] }\n',
            backend='[backend]\nkind = "local"\nslots = 2\nsandbox = "none"\n',
        ),
        "solution.py": solution,
        "evaluate.py": EVALUATOR,
    })
    proc = ratchet(repo, "run", timeout=120)
    assert proc.returncode == 0, proc.stderr
    db = ledger(repo)
    cand = db.candidates()[1]
    db.close()
    # reported by the worker (not lost and rerun), and never kept: evaluate.py vanished
    assert cand.attempt == 0, cand.reasons
    assert cand.status in ("crash", "rejected"), (cand.status, cand.reasons)
    assert "lost" not in (cand.reasons or "")
    assert (repo / ".ratchet" / "jobs" / cand.job_id / "result.json").exists()


def wait_no_processes_with(token: str, timeout: float = 10) -> list[str]:
    import time

    deadline = time.monotonic() + timeout
    while True:
        left = processes_under_token(token)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def processes_under_token(token: str) -> list[str]:
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and token in " ".join(
                proc.info["cmdline"] or []):
            found.append(f"{proc.pid}: {proc.info['cmdline']}")
    return found

