"""Ctrl-C and resume: stop cleanly, record what was cancelled, finish on the next run."""

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from helpers import ROOT, config_text, job_result, make_repo, results_tsv

from ratchet.store.ledger import Ledger

SLOW_SOLUTION = '''
"""Editable."""
import time

X = 3.0


def score():
    time.sleep(2.5)
    return (X - 1.25) ** 2
'''


def slow_repo(path):
    return make_repo(path, {
        "ratchet.toml": config_text(),
        "solution.py": SLOW_SOLUTION,
        "evaluate.py": "import solution\nprint(f'score: {solution.score():.6f}')\n",
    })


ROLLING_CLI = ROOT / "tests" / "reliability" / "rolling_cli.py"


def start_run(repo, mode="rounds"):
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    entry = ["-m", "ratchet.cli"]
    if mode == "rolling":  # the same CLI with search.mode = "rolling", 5 candidates
        entry = [str(ROLLING_CLI)]
        env["RATCHET_TEST_CANDIDATES"] = "5"
    return subprocess.Popen([sys.executable, *entry, "run", "--repo", str(repo)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def wait_for_status(repo, status, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        db = repo / ".ratchet" / "ledger.db"
        if db.exists():
            ledger = Ledger(db)
            try:
                if any(c.status == status for c in ledger.candidates()):
                    return
            finally:
                ledger.close()
        time.sleep(0.1)
    raise AssertionError(f"no candidate reached {status!r}")


@pytest.mark.slow  # 20-25 s each side by side
@pytest.mark.parametrize("mode", ["rounds", "rolling"])
def test_double_ctrl_c_cancels_running_jobs_and_resume_finishes(tmp_path, mode):
    repo = slow_repo(tmp_path / "r")
    proc = start_run(repo, mode)
    wait_for_status(repo, "submitted")
    # 2.5 s jobs: a loaded machine (CI, make test-cpu) once saw the baseline's 1.5 s job
    # end before the second Ctrl-C, leaving nothing running to cancel
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err  # stopped by Ctrl-C, not finished
    assert "resume" in err

    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    interrupted = [c for c in ledger.candidates() if c.status == "interrupted"]
    assert interrupted, [c.status for c in ledger.candidates()]
    events = [e["kind"] for e in ledger.events(interrupted[0].id)]
    assert "interrupted" in events
    ledger.close()
    # the interrupted jobs were cancelled, and no worker is left behind
    for cand in interrupted:
        assert job_result(repo, cand.job_id)["outcome"] == "cancelled"
    for p in psutil.process_iter(["cmdline"]):
        assert str(repo) not in " ".join(p.info["cmdline"] or []), p.info["cmdline"]

    proc = start_run(repo, mode)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    cands = ledger.candidates()
    # rounds: 3 x K=2 with the baseline; rolling: baseline + 5 that ran (a repeat of an
    # earlier candidate's files is recorded, unrun, on top of rolling's budget)
    counted = cands if mode == "rounds" else [c for c in cands if c.job_id is not None]
    assert len(counted) == 6, [(c.id, c.status, c.reasons) for c in cands]
    assert all(c.status == "rejected" for c in cands if c.job_id is None)
    assert all(c.is_judged for c in cands)
    # the interrupted candidates ran again under a new attempt id
    again = ledger.candidate(interrupted[0].id)
    assert again.attempt == 1 and again.job_id.endswith("-1")
    assert len(results_tsv(repo)) == len(cands)


def test_single_ctrl_c_finishes_the_round_then_stops(tmp_path):
    repo = slow_repo(tmp_path / "r")
    proc = start_run(repo)
    wait_for_status(repo, "submitted")
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err  # a stopped study is not a finished one
    assert "stopped; run `ratchet run` again to resume" in err
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    cands = ledger.candidates()
    assert len(cands) == 2 and all(c.is_judged for c in cands)  # round 1 judged, no round 2
    assert ledger.get("round") == 2


def test_resumed_tuner_proposes_what_an_uninterrupted_one_would(tmp_path):
    """The tuner rebuilds its state from the ledger each round: restarts change nothing."""
    from helpers import ratchet, score_repo

    knobs = '[tune.knobs]\n"solution.py:X" = { low = -5.0, high = 5.0 }\n'
    search = "[search]\nparallel = 3\nrounds = 4\n"
    straight = score_repo(tmp_path / "a", knobs=knobs, search=search)
    ratchet(straight, "run", check=True)
    stepped = score_repo(tmp_path / "b", knobs=knobs, search=search)
    for rounds in range(1, 5):
        ratchet(stepped, "run", "--rounds", str(rounds), check=True)
    a = Ledger(straight / ".ratchet" / "ledger.db").candidates()
    b = Ledger(stepped / ".ratchet" / "ledger.db").candidates()
    assert [c.params for c in a] == [c.params for c in b]
    assert [c.status for c in a] == [c.status for c in b]
    # a float range stays a float range
    assert any(isinstance(c.params["solution.py:X"], float) and
               not c.params["solution.py:X"].is_integer() for c in a if c.params)
