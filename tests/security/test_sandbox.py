"""The one sandbox (ratchet.job.sandbox + the warden) at every level this machine offers.

Each test runs a real untrusted party through `sandbox.Jail` or `sandbox.command` and checks
what an attacker with the source would try: read the trusted side's environment, outlive
the party with a setsid() daemon, keep running while frozen, write outside its tree, read a
hidden directory or a private home beside its tree.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ratchet.job import sandbox
from ratchet.job.sandbox import Jail, Level, Policy

LEVELS = [level for level, works in ((Level.BWRAP, sandbox.bwrap_works()),
                                     (Level.PIDNS, sandbox.unshare_prefix() is not None),
                                     (Level.NONE, True)) if works]
ROOT = os.geteuid() == 0
NAMESPACED = [level for level in LEVELS if level != Level.NONE]


def run_party(level: Level, policy: Policy, code: str, cwd: Path, timeout: float = 30,
              **env: str) -> subprocess.CompletedProcess:
    argv = sandbox.command(level, [sys.executable, "-c", code], policy)
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={"PATH": os.environ["PATH"], **env})


@pytest.fixture
def tree(tmp_path):
    work = tmp_path / "job" / "work"
    work.mkdir(parents=True)
    return work


@pytest.mark.parametrize("level", NAMESPACED)
def test_party_cannot_read_the_trusted_side(level, tree):
    """No view of this process: not in the party's /proc, nor its environment."""
    policy = Policy(writable=[tree], seed=str(tree))
    sandbox.grant([tree], policy)
    code = f"""
import os
pids = [p for p in os.listdir('/proc') if p.isdigit()]
try:
    leaked = open('/proc/{os.getpid()}/environ').read()
except OSError as exc:
    leaked = 'no: ' + type(exc).__name__
print(len(pids), os.getuid(), 'DRIVER_SECRET' in leaked)
"""
    os.environ["DRIVER_SECRET"] = "hunter2"
    try:
        out = run_party(level, policy, code, tree)
    finally:
        os.environ.pop("DRIVER_SECRET")
    assert out.returncode == 0, out.stderr
    count, uid, leaked = out.stdout.split()
    assert int(count) <= 3  # the warden, bubblewrap's init, the party
    assert leaked == "False"
    if ROOT:
        assert int(uid) == policy.party_uid() != 0


@pytest.mark.parametrize("level", LEVELS)
def test_a_setsid_daemon_dies_with_the_party(level, tree, tmp_path):
    marker = tmp_path / "daemon-alive"
    policy = Policy(writable=[tree, tmp_path], seed=str(tree))
    sandbox.grant([tmp_path], policy)
    code = f"""
import subprocess, sys
subprocess.Popen([sys.executable, '-c', '''
import os, time
for _ in range(600):
    open({str(marker)!r}, "w").write(str(time.time()))
    time.sleep(0.05)
'''], start_new_session=True)
"""
    code += f"""
import os, time
deadline = time.time() + 20
while not os.path.exists({str(marker)!r}) and time.time() < deadline:
    time.sleep(0.01)
"""
    out = run_party(level, policy, code, tree)
    assert out.returncode == 0, out.stderr
    assert marker.exists(), "the daemon never ran: the test proves nothing"
    time.sleep(0.3)
    before = marker.stat().st_mtime
    time.sleep(0.5)
    after = marker.stat().st_mtime if marker.exists() else 0
    assert before == after, "a daemon of the party outlived it"


@pytest.mark.parametrize("level", LEVELS)
def test_freeze_stops_every_process_of_the_party(level, tree, tmp_path):
    """A helper that escaped the process group (setsid) is frozen with the rest."""
    counter = tmp_path / "counter"
    policy = Policy(writable=[tree, tmp_path], seed=str(tree))
    sandbox.grant([tmp_path], policy)
    code = f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, '-c', '''
import os, time
n = 0
while True:
    n += 1
    open({str(counter)!r} + ".new", "w").write(str(n))
    os.replace({str(counter)!r} + ".new", {str(counter)!r})  # never seen half-written
    time.sleep(0.005)
'''], start_new_session=True)
time.sleep(60)
"""
    with Jail([sys.executable, "-c", code], policy, level=level, cwd=tree,
              env={"PATH": os.environ["PATH"]}) as jail:
        deadline = time.monotonic() + 20
        while not counter.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert jail.freeze()
        frozen_at = counter.read_text()
        time.sleep(0.4)
        assert counter.read_text() == frozen_at, "a process kept running while frozen"
        assert jail.thaw()
        # woken, it counts on: on a loaded machine it may take a while to be scheduled
        deadline = time.monotonic() + 20
        while counter.read_text() == frozen_at and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counter.read_text() != frozen_at, "a process of the party was not woken"
    assert jail.poll() is not None


@pytest.mark.parametrize("level", NAMESPACED)
def test_hidden_and_private_paths_are_out_of_sight(level, tmp_path):
    """Hidden dirs are empty; a private (0700) directory above the tree shows the tree and
    nothing beside it; the party writes its tree and nothing else."""
    home = tmp_path / "home"
    work = home / "repo" / "work"
    work.mkdir(parents=True)
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text("PRIVATE")
    holdout = home / "repo" / "holdout"
    holdout.mkdir()
    (holdout / "shapes.json").write_text("[1]")
    home.chmod(0o700)
    policy = Policy(writable=[work], hidden=[holdout], seed=str(work))
    sandbox.grant([work], policy)
    code = f"""
import os
def look(p):
    try:
        return sorted(os.listdir(p))
    except OSError as exc:
        return type(exc).__name__
open('mine.txt', 'w').write('ok')
try:
    open({str(home / 'repo' / 'planted.py')!r}, 'w').write('x')
    planted = 'yes'
except OSError:
    planted = 'no'
print(look({str(holdout)!r}), look({str(home / '.ssh')!r}), planted)
"""
    out = run_party(level, policy, code, work)
    assert out.returncode == 0, out.stderr
    assert (work / "mine.txt").read_text() == "ok"
    assert "shapes.json" not in out.stdout
    assert "id_rsa" not in out.stdout
    assert out.stdout.split()[-1] == "no" and not (home / "repo" / "planted.py").exists()


@pytest.mark.skipif(not ROOT, reason="the uid drop applies when the job runs as root")
@pytest.mark.parametrize("level", NAMESPACED)
def test_the_party_cannot_regain_root(level, tree):
    policy = Policy(writable=[tree], seed=str(tree))
    sandbox.grant([tree], policy)
    code = """
import os
try:
    os.setuid(0)
    print('root')
except PermissionError:
    print('denied', open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0])
"""
    out = run_party(level, policy, code, tree)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["denied", "1"]


def test_a_trusted_phase_keeps_the_callers_uid(tree):
    level = LEVELS[0]
    out = run_party(level, Policy(writable=[tree], drop_privileges=False), "import os; print(os.getuid())",
                    tree)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) == os.getuid()
