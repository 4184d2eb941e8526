"""Issue 34, attack 3: the trusted evaluator as the candidate's deputy.

The candidate's run phase leaves its output file as a symlink to a file only root can
read (or as a fifo). The evaluator runs after it, with more rights, in the same tree: if
it followed the link it would print the root-only content in its error, and that tail
would become the crash reason (ledger, `ratchet show`, the next prompt, the dashboard).
The worker must refuse what the run left before any trusted phase runs.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
import uuid
from pathlib import Path

import pytest
from helpers import config_text, make_repo
from redteam.test_redteam import cheat

from ratchet.job import leftovers
from security.studies import (
    LEVELS,
    assert_contained,
    checkout,
    incumbent,
    level_env,
    rows,
    submit_and_wait,
)

# an honest evaluator of the kind users write: reads the run's output, says what was wrong
EVALUATE = """
import sys
text = open("out.txt").read()
try:
    loss = float(text.split()[-1])
except (IndexError, ValueError):
    print(f"bad output from train.py: {text!r}")
    sys.exit(1)
print(f"score: {loss}")
"""
TRAIN = 'LOSS = 2.0\nopen("out.txt", "w").write(f"loss {LOSS}\\n")\n'


@pytest.fixture
def secret():
    """A file only root can read, outside /tmp (the sandbox's /tmp is private)."""
    folder = Path(tempfile.mkdtemp(prefix="ratchet-deputy-", dir="/var/tmp"))
    folder.chmod(0o700)
    path = folder / "root-only.txt"
    text = f"root-only-{uuid.uuid4().hex}"
    path.write_text(text + "\n")
    path.chmod(0o600)
    yield path, text.encode()
    shutil.rmtree(folder, ignore_errors=True)


def study(base: Path, level: str, backend: str = "") -> Path:
    """A study under `base` whose run phase writes out.txt and whose evaluator reads it
    (`backend`: more [backend] settings)."""
    mode = "bwrap" if level == "bwrap" else "auto"  # auto, with bubblewrap made to fail
    task = config_text().split("[task.metric]")[0].replace(
        'editable = ["solution.py"]', 'editable = ["train.py"]').replace(
        'timeout = "60s"', 'run = "python train.py"\ntimeout = "20s"')
    return make_repo(base / "repo", {
        "ratchet.toml": config_text(
            task=task, knobs="", search='[search]\nproposer = "tune"\nparallel = 1\n',
            backend=f'[backend]\nkind = "local"\nslots = 1\nsandbox = "{mode}"\n{backend}'),
        "evaluate.py": EVALUATE, "train.py": TRAIN})


ATTACKS = {
    "symlink": "import os\nos.symlink({target!r}, 'out.txt')\n",
    # the evaluator's open() would block on it until the job's timeout
    "fifo": "import os\nos.mkfifo('out.txt')\n",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
@pytest.mark.parametrize("level", LEVELS)
def test_the_evaluator_never_follows_what_the_run_left(tmp_path, level, attack, secret):
    env = level_env(level, tmp_path)
    path, text = secret
    repo = study(tmp_path, level)
    branch = cheat(repo, attack, {"train.py": ATTACKS[attack].format(target=str(path))})
    before = checkout(repo)  # `cheat` leaves main checked out, as it found it
    verdict = submit_and_wait(repo, branch, env)
    assert verdict["status"] == "rejected", verdict
    kind = {"symlink": "a symlink out of the job's tree", "fifo": "a fifo"}[attack]
    assert f"out.txt ({kind})" in verdict["reasons"], verdict["reasons"]
    assert "before evaluate" in verdict["reasons"]
    cand = next(c for c in rows(repo) if c.id == verdict["id"])
    assert cand.result["sandbox"] == level
    assert "evaluate" not in [p["name"] for p in cand.result["phases"]]  # never started
    baseline = next(c for c in rows(repo) if c.kind == "baseline")
    assert incumbent(repo) == baseline.commit_sha  # nothing of the attacker's is kept
    assert_contained(repo, before, env, secret=text)
    # the study goes on: an honest candidate is judged (and kept) after it
    honest = cheat(repo, "honest", {"train.py": TRAIN.replace("2.0", "1.0")})
    assert submit_and_wait(repo, honest, env)["status"] == "keep"
    assert_contained(repo, before, env, secret=text)


def test_every_kind_of_leftover_is_named(tmp_path):
    """The check itself, on a tree with one of each (a study reaches only some of them:
    bubblewrap's mounts refuse hard links across them, and only root makes devices)."""
    tree = tmp_path / "work"
    (tree / "sub").mkdir(parents=True)
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    (tree / "inside.txt").write_text("y")
    (tree / "sub" / "ok").symlink_to("../inside.txt")  # stays in the tree: allowed
    os.link(outside, tree / "hard")
    os.link(tree / "inside.txt", tree / "sub" / "hard-inside")  # both links inside: allowed
    os.mkfifo(tree / "fifo")
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(tree / "sock"))
    if os.geteuid() == 0:
        os.mknod(tree / "null", stat.S_IFCHR | 0o600, os.makedev(1, 3))
    (tree / "data").symlink_to("/etc")  # the study's own commit has it: allowed as is
    committed = leftovers.symlinks(tree)
    (tree / "up").symlink_to("../outside.txt")
    (tree / "abs").symlink_to("/etc/hostname")
    found = leftovers.refused([tree], committed)
    expected = {"up (a symlink out of the job's tree)", "abs (a symlink out of the job's tree)",
                "hard (a hard link to a file outside the job's tree)", "fifo (a fifo)", "sock (a socket)"}
    if os.geteuid() == 0:
        expected.add("null (a device)")
    assert set(found) == expected
    (tree / "data").unlink()
    (tree / "data").symlink_to("/root")  # retargeted by a phase: refused
    assert "data (a symlink out of the job's tree)" in leftovers.refused([tree], committed)
