"""Issue 34, attack 5: a full disk, a fork bomb.

The run phase writes 1 MiB files until the filesystem holding `.ratchet/` is full, or
forks until it cannot. Both attacks are bounded here (a few seconds, 300 processes) so
that, where nothing stops them, they end on their own: the study then sees an honest
looking result, or a disk too full for its ledger. With the bounds the run is stopped
at once, the candidate is a `crash` naming the bound (never retried as an infrastructure
fault), what it wrote is gone, and the study goes on. The disk attacks run on a small
tmpfs of their own: the filesystem of the study's state.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from redteam.test_redteam import cheat

from security.studies import (
    LEVELS,
    assert_contained,
    checkout,
    incumbent,
    level_env,
    rows,
    submit_and_wait,
)
from security.test_deputy import TRAIN, study

FILL = """
import os, time
os.makedirs("fill", exist_ok=True)
block = b"x" * (1 << 20)
end, i = time.time() + 6, 0
while time.time() < end:  # on past ENOSPC, as a careless training loop would
    try:
        with open(f"fill/{i}", "wb") as fh:
            fh.write(block)
        i += 1
    except OSError:
        time.sleep(0.01)
open("out.txt", "w").write("loss 1.0\\n")
"""

FORK = """
import os, time
for _ in range(300):
    try:
        if os.fork() == 0:
            time.sleep(30)
            os._exit(0)
    except OSError:
        time.sleep(0.01)
open("out.txt", "w").write("loss 1.0\\n")
"""

FS_MB = 256


@pytest.fixture
def small_fs(tmp_path):
    """A tmpfs of FS_MB MiB, mounted for this test alone (root only)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "fs"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={FS_MB}m", "tmpfs",
                           str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def attack(repo: Path, level: str, env: dict[str, str], code: str, bound: str) -> None:
    """Submit `code` as train.py; it must be a crash naming `bound`, run once, and the
    study must go on (an honest candidate is then kept)."""
    branch = cheat(repo, "attack", {"train.py": code})
    before = checkout(repo)
    verdict = submit_and_wait(repo, branch, env)
    assert verdict["status"] == "crash", verdict
    assert f"passed the job's {bound} bound" in verdict["reasons"], verdict["reasons"]
    cand = next(c for c in rows(repo) if c.id == verdict["id"])
    assert cand.result["sandbox"] == level
    jobs = list((repo / ".ratchet" / "jobs").glob(f"*-{cand.id}-*"))
    assert len(jobs) == 1, jobs  # run once: not retried as an infrastructure fault
    assert incumbent(repo) != cand.commit_sha  # nothing of the attacker's is kept
    assert_contained(repo, before, env)
    honest = cheat(repo, "honest", {"train.py": TRAIN.replace("2.0", "1.0")})
    assert submit_and_wait(repo, honest, env)["status"] == "keep"
    assert_contained(repo, before, env)


@pytest.mark.parametrize("level", LEVELS)
def test_a_fork_bomb_meets_the_jobs_pids_bound(tmp_path, level):
    env = level_env(level, tmp_path)
    repo = study(tmp_path, level, "job_pids = 64\n")
    attack(repo, level, env, FORK, "pids")


@pytest.mark.parametrize("level", LEVELS)
def test_filling_the_disk_meets_the_jobs_disk_bound(tmp_path, level, small_fs):
    env = level_env(level, tmp_path)
    repo = study(small_fs, level, "job_disk_gb = 0.02\n")
    attack(repo, level, env, FILL, "disk")
    assert not list((repo / ".ratchet" / "jobs").glob("*/work/fill/*"))  # removed


@pytest.mark.parametrize("level", LEVELS)
def test_filling_the_disk_never_fills_the_ledgers_filesystem(tmp_path, level, small_fs):
    """No job_disk_gb: the reserve of the state's filesystem is the bound."""
    env = level_env(level, tmp_path)
    repo = study(small_fs, level)
    attack(repo, level, env, FILL, "disk reserve")
    st = os.statvfs(small_fs)
    assert st.f_bavail * st.f_frsize > FS_MB * (1 << 20) // 2  # what it wrote is gone
