"""Standby workers forked by one spare server (local backend).

Real studies, real processes: which process ran each job, what is left when the driver
is killed, and what happens when the server itself dies.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from gates import HOLD, job_tree
from helpers import ROOT, config_text, make_repo

from ratchet.driver.study import Study
from ratchet.store.ledger import Ledger

# the evaluator writes down its process's ancestry (no sandbox: the whole tree is visible);
# the candidates named in HELD run until the test opens their gate (tests/gates.py)
EVALUATE = HOLD + '''
import json, os, time
import psutil
import solution
chain = []
proc = psutil.Process()
while proc is not None:
    chain.append({"pid": proc.pid, "cmdline": " ".join(proc.cmdline())})
    proc = proc.parent()
with open(os.path.join(os.environ["RATCHET_WORKDIR"], "ancestry.json"), "w") as fh:
    json.dump(chain, fh)
time.sleep(solution.SLEEP)
if os.environ.get("RATCHET_CANDIDATE") in HELD:
    hold()
print(f"score: {solution.X}")
'''

SOLUTION = "X = {x}\nSLEEP = {sleep}\n"


def repo_for(path: Path, *, parallel: int = 2, rounds: int = 2, sleep: float = 0.2,
             held: tuple[str, ...] = ()) -> Path:
    return make_repo(path, {
        "ratchet.toml": config_text(
            search=f'[search]\nproposer = "tune"\nparallel = {parallel}\nrounds = {rounds}\n',
            knobs='[tune.knobs]\n"solution.py:X" = { choices = [5, 4, 3, 2, 1] }\n',
            backend=(f'[backend]\nkind = "local"\nslots = {parallel}\nsandbox = "none"\n'
                     'keep_workdirs = "all"\n')),
        "evaluate.py": f"HELD = {held!r}\n" + EVALUATE,
        "solution.py": SOLUTION.format(x=9, sleep=sleep),
    })


def servers_of(jobs_dir: Path) -> list[psutil.Process]:
    """Spare servers and idle spares of this study: they run in its jobs directory."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if "--spare-server" in (proc.info["cmdline"] or []) and \
                    Path(proc.cwd()) == jobs_dir:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def started_by_us(proc: psutil.Process) -> bool:
    """The process is a child of this test process (False once it has gone: a spare that
    served its job exits at any moment)."""
    try:
        return proc.ppid() == os.getpid()
    except psutil.Error:
        return False


def run_study(repo: Path, **kwargs) -> list:
    """Run the study in this process; its candidates as the ledger has them."""
    study = Study(repo, **kwargs)
    try:
        study.run()
    finally:
        study.close()
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        return ledger.candidates()
    finally:
        ledger.close()


def test_every_job_runs_in_a_spare_forked_by_one_server(tmp_path):
    repo = repo_for(tmp_path / "r")
    cands = run_study(repo)
    assert len(cands) == 4 and all(c.status in ("keep", "discard") for c in cands)
    servers = set()
    for cand in cands:
        chain = json.loads((repo / ".ratchet" / "jobs" / f"demo-{cand.id}-0" / "work" /
                            "ancestry.json").read_text())
        # evaluator <- sh <- worker (a forked spare) <- spare server <- this driver
        at = next(i for i, p in enumerate(chain) if "ratchet.job.worker" in p["cmdline"])
        worker, server, driver = chain[at], chain[at + 1], chain[at + 2]
        assert "--spare-server" in worker["cmdline"] and "--spare-server" in server["cmdline"]
        assert driver["pid"] == os.getpid()
        servers.add(server["pid"])
    assert len(servers) == 1  # one interpreter loaded; every worker a fork of it
    # closed with the study: no server, no idle spare left behind
    deadline = time.monotonic() + 10
    while servers_of(repo / ".ratchet" / "jobs") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not servers_of(repo / ".ratchet" / "jobs")


def test_a_killed_driver_leaves_running_jobs_and_nothing_idle(tmp_path):
    """kill -9 of the driver: its server reads EOF and exits, idle spares with it; a job
    already handed to a spare runs on, and the resumed study takes its result."""
    # the first round's jobs run until the test has looked (held, not a 3 s sleep that a
    # loaded machine could outlast)
    first_round = ("c0000", "c0001")
    repo = repo_for(tmp_path / "r", parallel=2, rounds=2, held=first_round)
    jobs_dir = repo / ".ratchet" / "jobs"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    driver = subprocess.Popen([sys.executable, "-m", "ratchet.cli", "run", "--repo", str(repo)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(list(jobs_dir.glob("*/state.json"))) < 2:
            time.sleep(0.05)
        assert len(list(jobs_dir.glob("*/state.json"))) == 2, "the first round never started"
        time.sleep(0.5)  # spares for the next round are up by now
    finally:
        driver.kill()  # SIGKILL: nothing of the driver's own clean-up runs
        driver.wait()
    running = [json.loads(p.read_text())["pid"] for p in jobs_dir.glob("*/pid.json")]
    deadline = time.monotonic() + 10
    while servers_of(jobs_dir) and time.monotonic() < deadline:
        time.sleep(0.1)
    leftovers = [p for p in servers_of(jobs_dir) if p.pid not in running]
    assert not leftovers, [(p.pid, p.cmdline()) for p in leftovers]
    assert all(psutil.pid_exists(pid) for pid in running)  # the jobs ran on
    for cand in first_round:
        (job_tree(repo, f"demo-{cand}-0") / "gate").touch()
    # resumed: the first round's results are taken, nothing runs twice
    proc = subprocess.run([sys.executable, "-m", "ratchet.cli", "run", "--repo", str(repo)],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    cands = ledger.candidates()
    ledger.close()
    assert len(cands) == 4 and all(c.attempt == 0 for c in cands), \
        [(c.id, c.status, c.attempt) for c in cands]
    assert all(c.status in ("keep", "discard") for c in cands)


def test_a_dead_server_costs_only_speed(tmp_path):
    """The server killed between rounds: the next placement starts another server."""
    repo = repo_for(tmp_path / "r", parallel=2, rounds=3, sleep=0.5)
    killed: list[int] = []

    def on_progress(progress) -> None:
        if progress.round == 2 and not killed:
            for proc in servers_of(repo / ".ratchet" / "jobs"):
                if started_by_us(proc):
                    proc.kill()  # the server itself, not a spare
                    killed.append(proc.pid)

    cands = run_study(repo, progress=on_progress)
    assert killed
    # round 3's jobs ran in spares of a second server
    chains = [json.loads((repo / ".ratchet" / "jobs" / f"demo-{c.id}-0" / "work" /
                          "ancestry.json").read_text()) for c in cands if c.round == 3]
    parents = {next(chain[i + 1]["pid"] for i, p in enumerate(chain)
                    if "ratchet.job.worker" in p["cmdline"]) for chain in chains}
    assert parents and not parents & set(killed)
    assert len(cands) == 6 and all(c.status in ("keep", "discard") for c in cands), \
        [(c.id, c.status, c.reasons) for c in cands]


def test_a_stuck_server_is_waited_for_once_then_replaced(tmp_path):
    """A server that owes spares and does not answer (here: stopped) costs one wait; it is
    killed, its idle spares go with it, and the next placement starts a new server."""
    from ratchet.backends.spares import SpareServer
    from ratchet.job.jobspec import worker_env

    def server_pids() -> set[int]:
        return {p.pid for p in servers_of(tmp_path) if started_by_us(p)}

    spares = SpareServer(tmp_path, worker_env(dict(os.environ)), log=tmp_path / "spares.log",
                         wait_s=0.5)
    try:
        spares.request(1)
        first = spares.take()
        (server,) = server_pids()
        assert first is not None and psutil.Process(first.pid).ppid() == server
        os.kill(server, signal.SIGSTOP)
        spares.request(1)
        began = time.monotonic()
        assert spares.take() is None
        assert 0.4 < time.monotonic() - began < 5
        assert not psutil.pid_exists(server) or \
            psutil.Process(server).status() == psutil.STATUS_ZOMBIE
        first.wait(timeout=5)  # idle, its server gone: it read EOF and left
        second = spares.take()  # from a new server, started for it
        deadline = time.monotonic() + 20  # a new interpreter's start-up, on a loaded machine
        while second is None and time.monotonic() < deadline:
            spares.request(1)
            second = spares.take()
        assert second is not None
        assert psutil.Process(second.pid).ppid() in server_pids() - {server}
    finally:
        spares.close()
    deadline = time.monotonic() + 5
    while servers_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not servers_of(tmp_path)
