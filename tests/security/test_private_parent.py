"""A checkout and a venv under a directory the sandbox's uid cannot enter (issue 39).

As root, the untrusted parties (the candidate's build phase, the evaluator's candidate
child) run as an unprivileged uid. A study cloned into a 0700 `mktemp -d`, with its venv
there too, must either run and keep the honest improvement (bubblewrap and the `unshare`
level open the private parent for the party) or refuse before recording anything with
one line naming the path, the uid and the fix; and a venv closed under a running study
is the machine's fault, never the candidate's.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import CHILD_SCORE_EVALUATOR, ROOT, git, ratchet, results_tsv, sandbox_env, score_repo

from ratchet.job import sandbox

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the uid drop happens only as root")

LEVELS = ["bwrap", "pidns"]

# The evaluator (helpers' CHILD_SCORE_EVALUATOR) calls the candidate in a sandboxed child
# (as the uid), and the task has a build phase (as the uid too): both start the venv's
# interpreter.

# A candidate that would pass its crash off as the machine's: its build (which imports
# it) prints the warden's words and exits 126, as the warden does when it cannot start.
FAKER = '''
if X == 5.0:
    import sys
    print("ratchet sandbox: cannot start python: [Errno 13] Permission denied", flush=True)
    sys.exit(126)
'''

TASK = '''
[task]
name = "demo"
editable = ["solution.py"]
protected = ["evaluate.py"]
build = "python -c 'import solution'"
evaluate = "python evaluate.py"
timeout = "60s"
'''


def private_venv(parent: Path, umask: int = 0o022) -> Path:
    """A venv of this interpreter under `parent` that sees this environment's packages
    and ratchet's source; made under `umask` (077: closed to everyone but root)."""
    venv = parent / "venv"
    old = os.umask(umask)
    try:
        subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv",
                        "--without-pip", str(venv)], check=True, timeout=120)
    finally:
        os.umask(old)
    site = next((venv / "lib").glob("python*/site-packages"))
    shared = [p for p in sys.path if p.endswith("-packages") and Path(p).is_dir()]
    (site / "shared.pth").write_text("\n".join([str(ROOT / "src"), *shared]) + "\n")
    return venv / "bin" / "python"


def level_env(level: str, tmp_path: Path) -> dict[str, str]:
    """The driver's environment for a sandbox level; both need `unshare` (the pidns
    fallback, and opening a private parent)."""
    if sandbox.unshare_prefix() is None:
        pytest.skip("unshare cannot make a PID namespace here")
    return sandbox_env(level, tmp_path)


def private_study(tmp_path: Path, umask: int = 0o022) -> tuple[Path, Path]:
    """(repo, its venv's python) under a 0700 directory, as `mktemp -d` makes one."""
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    python = private_venv(private, umask)
    repo = score_repo(private / "task", task=textwrap.dedent(TASK))
    (repo / "evaluate.py").write_text(textwrap.dedent(CHILD_SCORE_EVALUATOR))
    git(repo, "commit", "-qam", "the evaluator calls the candidate in its child")
    return repo, python


def recorded(repo: Path) -> tuple[int, object]:
    """(candidates in the ledger, the pinned start) — (0, None) when nothing is recorded."""
    db = repo / ".ratchet" / "ledger.db"
    if not db.exists():
        return 0, None
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        count = conn.execute("SELECT COUNT(*) FROM candidates").fetchone()[0]
        pinned = conn.execute("SELECT value FROM meta WHERE key = 'pinned'").fetchone()
    return count, pinned


@pytest.mark.parametrize("level", LEVELS)
def test_a_study_under_a_private_directory_keeps_the_honest_improvement(tmp_path, level):
    """Checkout and venv under a 0700 parent: the sandbox opens the parent for the uid,
    the build phase and the evaluator's child start, and the known best is kept."""
    env = level_env(level, tmp_path)
    repo, python = private_study(tmp_path)
    solution = (repo / "solution.py").read_text()
    (repo / "solution.py").write_text(solution + FAKER)
    git(repo, "commit", "-qam", "X = 5.0 fakes the warden's words")
    proc = ratchet(repo, "run", env=env, python=str(python))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = results_tsv(repo)
    # the faker's build died with the warden's words, but its sandbox could start it:
    # its own crash (the probe decides, not what it printed)
    assert [r["status"] for r in rows if "X=5.0" in r["description"]] == ["crash"], rows
    others = [r["status"] for r in rows if "X=5.0" not in r["description"]]
    assert "crash" not in others and "rejected" not in others, rows
    kept = [float(r["score"]) for r in rows if r["status"] == "keep"]
    assert len(kept) >= 2 and kept[-1] < kept[0], rows  # the baseline, then better


@pytest.mark.parametrize("level", LEVELS)
def test_a_venv_others_cannot_read_is_refused_before_anything_is_recorded(tmp_path, level):
    """A venv made under umask 077: no bind opens it (the uid is shut out of the venv
    itself). `run` and `submit` refuse with one line naming the path, the uid and the
    fix; the ledger holds nothing and no study branch is made."""
    env = level_env(level, tmp_path)
    repo, python = private_study(tmp_path, umask=0o077)
    venv = python.parents[1]
    for args in (("run",), ("submit", "HEAD")):
        proc = ratchet(repo, *args, env=env, python=str(python))
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        assert len(lines) == 1, proc.stderr
        line = lines[0]
        uid = sandbox.untrusted_uid(str(repo / ".ratchet"))
        assert f"uid {uid}" in line and str(venv) in line, line
        assert f"chmod -R o+rX {venv}" in line and "move the checkout" in line, line
        assert recorded(repo) == (0, None)
        assert not (repo / "results.tsv").exists()
        assert git(repo, "branch", "--list", "ratchet/*") == ""
    # the fix the line names works
    subprocess.run(["chmod", "-R", "o+rX", str(venv)], check=True)
    proc = ratchet(repo, "run", "--rounds", "1", env=env, python=str(python))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_a_venv_closed_under_a_running_study_is_never_the_candidates_fault(tmp_path):
    """The machine changes after the check: once the baseline's job is done, the venv
    is closed (0700). The next jobs' build phases and children cannot start: each is run
    again, then the study stops with the line and leaves its candidate pending; nothing
    is `crash`, `rejected` or `correct: false`. Mended, it resumes and keeps the gain."""
    env = {**os.environ, **level_env("bwrap", tmp_path), "PYTHONPATH": str(ROOT / "src")}
    repo, python = private_study(tmp_path)
    venv = python.parents[1]
    driver = subprocess.Popen([str(python), "-m", "ratchet.cli", "run", "--repo", str(repo)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not list((repo / ".ratchet" / "jobs").glob("*-c0000-*/result.json")):
            assert driver.poll() is None and time.monotonic() < deadline, driver.communicate()
            time.sleep(0.02)
        venv.chmod(0o700)
        out, err = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode != 0, out[-2000:]
    assert "Traceback" not in out + err, out + err
    assert "cannot reach" in err and f"chmod -R o+rX {venv}" in err, err
    if (repo / "results.tsv").exists():
        assert {r["status"] for r in results_tsv(repo)} <= {"keep", "discard"}
    with sqlite3.connect(f"file:{repo / '.ratchet' / 'ledger.db'}?mode=ro", uri=True) as conn:
        rows = dict(conn.execute("SELECT id, status FROM candidates").fetchall())
        shut_out = conn.execute("SELECT COUNT(*) FROM events WHERE kind = "
                                "'sandbox-unreachable'").fetchone()[0]
    assert "interrupted" in rows.values() and shut_out >= 2, (rows, shut_out)
    # mended: the same command resumes and keeps
    venv.chmod(0o755)
    proc = ratchet(repo, "run", env=env, python=str(python))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = results_tsv(repo)
    assert {r["status"] for r in rows} <= {"keep", "discard"}, rows
    kept = [float(r["score"]) for r in rows if r["status"] == "keep"]
    assert len(kept) >= 2 and kept[-1] < kept[0], rows


def test_an_agent_command_others_cannot_read_is_refused_before_anything_is_recorded(tmp_path):
    """The agent's own command, a script only root may read: the agent's probe (its
    policy, its uid) names it; the jobs' parties could start, nothing is recorded."""
    env = level_env("bwrap", tmp_path)
    repo, python = private_study(tmp_path)
    agent = tmp_path / "agent.sh"
    agent.write_text("#!/bin/sh\nexit 0\n")
    agent.chmod(0o700)
    config = (repo / "ratchet.toml").read_text().replace('proposer = "tune"', 'proposer = "agent"')
    (repo / "ratchet.toml").write_text(config + f'\n[agent]\ncommand = "{agent} {{prompt_file}}"\n')
    git(repo, "commit", "-qam", "an agent proposes")
    proc = ratchet(repo, "run", env=env, python=str(python))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    line = proc.stderr.strip()
    assert "\n" not in line and "the agent" in line and f"cannot read {agent}" in line, line
    assert f"chmod -R o+rX {agent}" in line, line
    assert recorded(repo) == (0, None)


HOLDOUT_EVALUATOR = '''
import os, sys
from pathlib import Path
from ratchet.evaluator.isolate import CandidateProcess
python = None
if "--holdout" in sys.argv and os.environ.get("CLOSE_THE_CHILD"):
    # the child's interpreter where its uid cannot go: a 0700 directory of the job's own
    closed = Path(os.environ["TMPDIR"]) / "closed"
    closed.mkdir(mode=0o700, exist_ok=True)
    python = closed / "python"
    if not python.exists():
        python.symlink_to(sys.executable)
with CandidateProcess("solution.py", python=str(python) if python else None) as cand:
    value = cand.call("score")
print("correct: true")
print(f"score: {value:.6f}")
'''


def test_a_holdout_whose_child_cannot_start_is_never_overfit(tmp_path):
    """The hold-out evaluator of a would-be keep cannot start its candidate child: the
    study stops with the line (not `rejected` as overfit); mended, the same command
    judges it again on a fresh hold-out job and keeps it."""
    env = {**level_env("bwrap", tmp_path), "CLOSE_THE_CHILD": "1"}
    repo, python = private_study(tmp_path)
    (repo / "evaluate.py").write_text(textwrap.dedent(HOLDOUT_EVALUATOR))
    config = (repo / "ratchet.toml").read_text().replace(
        'timeout = "60s"', 'timeout = "60s"\nholdout = "python evaluate.py --holdout"\n'
        'env = ["CLOSE_THE_CHILD"]')
    (repo / "ratchet.toml").write_text(config)
    git(repo, "commit", "-qam", "a hold-out evaluation")
    proc = ratchet(repo, "run", env=env, python=str(python))
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "the evaluator's candidate child" in proc.stderr and "fix:" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    if (repo / "results.tsv").exists():
        assert "rejected" not in {r["status"] for r in results_tsv(repo)}
    proc = ratchet(repo, "run", env={**env, "CLOSE_THE_CHILD": ""}, python=str(python))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = results_tsv(repo)
    assert {r["status"] for r in rows} <= {"keep", "discard"}, rows
    kept = [float(r["score"]) for r in rows if r["status"] == "keep"]
    assert len(kept) >= 2 and kept[-1] < kept[0], rows
