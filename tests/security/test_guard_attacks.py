"""Red team: tampering with the study's state, and faults of the machine, through the CLI.

- A candidate (no bubblewrap: it can write the ledger) swaps its own row's commit for
  a commit whose evaluator prints zero: the swap is caught and undone, the fake
  evaluator never reaches the study branch.
- `ratchet submit` while `ratchet run` runs is a person's act, never tampering.
- A ref planted under a future candidate's name does not break the study.
- A corrupted or locked ledger, and a read-only object store, give one line naming the
  cause and the fix; no candidate is blamed.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from helpers import GIT_ENV, ROOT, git, ratchet, score_repo

from ratchet.driver import infra
from ratchet.job import sandbox
from ratchet.store.ledger import Ledger

# imported by the evaluator, so it runs where candidate code runs
TAMPERING_SOLUTION = '''
import os, sqlite3, subprocess
X = 1.0
SLEEP = 0.0
REPO = {repo!r}


def git(*args, data=None):
    return subprocess.run(["git", "-C", REPO, *args], input=data, capture_output=True,
                          check=True, env={{**os.environ, **{env!r}}}).stdout.decode().strip()


def forge():
    """A commit whose evaluator prints zero, swapped in as this candidate's commit."""
    fake = git("hash-object", "-w", "--stdin", data=b"print('correct: true')\\nprint('score: 0')\\n")
    head = git("rev-parse", "HEAD")
    index = os.path.join(os.environ.get("TMPDIR", "/tmp"), "forge-index")
    env = {{**os.environ, "GIT_INDEX_FILE": index}}
    subprocess.run(["git", "-C", REPO, "read-tree", head], env=env, check=True)
    subprocess.run(["git", "-C", REPO, "update-index", "--cacheinfo",
                    f"100644,{{fake}},evaluate.py"], env=env, check=True)
    tree = subprocess.run(["git", "-C", REPO, "write-tree"], env=env, capture_output=True,
                          check=True).stdout.decode().strip()
    commit = git("commit-tree", tree, "-p", head, "-m", "fake evaluator")
    db = sqlite3.connect(os.path.join(REPO, ".ratchet", "ledger.db"), timeout=5)
    db.execute("UPDATE candidates SET commit_sha = ? WHERE kind = 'candidate' "
               "AND status = 'submitted'", (commit,))
    db.commit()
    return commit


def score():
    open(os.path.join(REPO, "forged.txt"), "w").write(forge())
    return (X - 1.25) ** 2
'''


def no_bwrap(tmp_path) -> dict[str, str]:
    if sandbox.unshare_prefix() is None:
        pytest.skip("unshare cannot make a PID namespace here")
    stub = tmp_path / "stub-bin"
    stub.mkdir(exist_ok=True)
    (stub / "bwrap").write_text("#!/bin/sh\nexit 1\n")
    (stub / "bwrap").chmod(0o755)
    return {"PATH": f"{stub}{os.pathsep}{os.environ['PATH']}"}


def no_traceback(proc: subprocess.CompletedProcess) -> str:
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out, out
    return out


def test_a_swapped_commit_in_the_ledger_is_caught_and_never_reaches_the_branch(tmp_path):
    # no sandbox: the candidate runs with the driver's rights and can write the ledger (with
    # any sandbox, as root, it runs as a uid of its own and cannot: the guard is the backstop)
    env: dict[str, str] = {}
    repo = score_repo(tmp_path / "r", search="", knobs="",
                      backend='[backend]\nkind = "local"\nslots = 2\nsandbox = "none"\n')
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "evil")
    (repo / "solution.py").write_text(TAMPERING_SOLUTION.format(repo=str(repo), env=GIT_ENV))
    git(repo, "commit", "-qam", "evil")
    proc = ratchet(repo, "submit", "evil", "--base", head, env=env)
    assert proc.returncode == 0, proc.stderr
    cand = proc.stdout.split()[-1]
    waited = ratchet(repo, "wait", cand, env=env)
    out = no_traceback(waited)
    if not (repo / "forged.txt").exists():
        pytest.skip("even without a sandbox the candidate could not write the repository "
                    "here (it runs as a uid of its own): nothing for the guard to catch")
    forged = (repo / "forged.txt").read_text().strip()
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        row = ledger.candidate(cand)
        assert row.status == "rejected" and "tampering" in row.reasons, (row.status, out)
        assert row.commit_sha == git(repo, "rev-parse", "evil")  # the swap was undone
        assert ledger.get("incumbent") != forged
    finally:
        ledger.close()
    assert git(repo, "rev-parse", "ratchet/demo") != forged
    assert forged not in git(repo, "rev-list", "ratchet/demo")


def slow_tune_repo(path):
    """A `ratchet run` of 2 rounds of 2 slow candidates (1.5 s each): long enough for a
    person, or their agent, to submit beside it."""
    return score_repo(path, search='[search]\nproposer = "tune"\nparallel = 2\n'
                      'rounds = 2\n',
                      knobs='[tune.knobs]\n"solution.py:SLEEP" = { choices = [1.5] }\n'
                            '"solution.py:X" = { choices = [2.0, 1.5, 1.0, 0.5] }\n')


@contextlib.contextmanager
def run_in_flight(repo) -> Iterator[subprocess.Popen]:
    """A real `ratchet run` of REPO, once its first job runs; killed if still running at
    the end (the body lets it end with `communicate`)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    runner = subprocess.Popen([sys.executable, "-m", "ratchet.cli", "run", "--repo", str(repo)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=full_env)
    try:
        deadline = time.monotonic() + 60
        while not (repo / ".ratchet" / "ledger.db").exists() or not any(
                c.status == "submitted" for c in _cands(repo)):
            assert time.monotonic() < deadline and runner.poll() is None
            time.sleep(0.1)
        yield runner
    finally:
        if runner.poll() is None:
            runner.kill()
            runner.communicate()


def test_submit_during_a_run_is_not_tampering(tmp_path):
    repo = slow_tune_repo(tmp_path / "r")
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "-b", "mine")
    (repo / "solution.py").write_text((repo / "solution.py").read_text()
                                      .replace("X = 3.0", "X = 1.25"))
    git(repo, "commit", "-qam", "the exact answer")
    git(repo, "checkout", "-q", "main")
    with run_in_flight(repo) as runner:
        submitted = ratchet(repo, "submit", "mine", "-m", "a person's try", "--base", head)
        assert submitted.returncode == 0, submitted.stderr
        out, err = runner.communicate(timeout=200)
    assert runner.returncode == 0, out + err
    assert "tampering" not in out + err and "Traceback" not in out + err
    cand = submitted.stdout.split()[-1]
    waited = ratchet(repo, "wait", cand)
    assert waited.returncode == 0, waited.stderr
    rows = _cands(repo)
    assert not [c for c in rows if "tampering" in (c.reasons or "")]
    assert {c.id: c.status for c in rows}[cand] in ("keep", "discard")


def test_an_mcp_submission_during_a_run_is_queued_never_tampering(tmp_path):
    """Issue 37: an agent's `submit` through `ratchet mcp` while `ratchet run` drives the
    study is recorded and runs at once; its `wait` says the run holds the study; once the
    run ends, `wait` judges it. The run sees no tampering and rejects nothing."""
    pytest.importorskip("mcp", reason="the mcp extra is not installed")
    from mcp_kit import call, edited, in_process

    repo = slow_tune_repo(tmp_path / "r")
    exact = edited(repo, "X = 3.0", "X = 1.25")

    async def beside(client):
        sub = await call(client, "submit", files=exact, description="the exact answer")
        return sub, await call(client, "wait", ids=[sub["id"]], timeout=1)

    async def after(client, cand):
        stale = await call(client, "wait", ids=[cand], timeout=200)
        # the agent goes on from the incumbent it now finds, as program.md says
        source = (await call(client, "files", paths=["solution.py"]))["files"]["solution.py"]
        again = re.sub(r"(?m)^X = .*$", "X = 1.25", re.sub(r"(?m)^SLEEP = .*$", "SLEEP = 0.0",
                                                          source))
        sub = await call(client, "submit", files={"solution.py": again},
                         description="the exact answer, on the incumbent")
        return stale, sub, await call(client, "wait", ids=[sub["id"]], timeout=200)

    with run_in_flight(repo) as runner:
        sub, held = in_process(repo, beside)
        out, err = runner.communicate(timeout=200)
    assert runner.returncode == 0, out + err
    assert "tampering" not in out + err and "Traceback" not in out + err
    assert sub["status"] == "submitted"  # running at once, beside the run's own jobs
    assert held["done"] is False and "held by a ratchet run" in held["next"]
    rows = _cands(repo)
    mine = {c.id: c for c in rows}[sub["id"]]
    assert mine.proposer == "mcp" and mine.kind == "candidate"
    assert not [c for c in rows if "tampering" in (c.reasons or "") or c.status == "rejected"]
    run_kept = git(repo, "rev-parse", "ratchet/demo")
    assert run_kept != mine.parent  # the run kept a change meanwhile: this one is stale
    stale, again, judged = in_process(repo, lambda client: after(client, sub["id"]))
    # judged by the judge like any candidate: made on the baseline, it is a stale winner,
    # confirmed as its own files against the incumbent the run left, and kept as them
    (verdict,) = stale["verdicts"]
    assert verdict["status"] == "keep", (verdict["reasons"], verdict["code"])
    assert "made on an older incumbent" in verdict["reasons"]
    # made again on that incumbent, the same answer (only its SLEEP differs) is no better
    (verdict,) = judged["verdicts"]
    assert verdict["status"] == "discard", (verdict["reasons"], verdict["code"])
    assert git(repo, "rev-parse", "ratchet/demo") == mine.commit_sha != again["commit"]


def _cands(repo):
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        return ledger.candidates()
    finally:
        ledger.close()


def test_a_planted_ref_under_a_future_candidate_does_not_break_the_study(tmp_path):
    repo = score_repo(tmp_path / "r", search='[search]\nproposer = "tune"\nparallel = 2\n'
                      'rounds = 2\n')
    head = git(repo, "rev-parse", "HEAD")
    git(repo, "update-ref", "refs/ratchet/demo/c0002/x", head)
    git(repo, "update-ref", "refs/ratchet/demo/c0003/y", head)
    proc = ratchet(repo, "run")
    no_traceback(proc)
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "rev-parse", "refs/ratchet/demo/c0002") != head
    again = ratchet(repo, "run", "--rounds", "3")  # a resume works too
    no_traceback(again)
    assert again.returncode == 0, again.stderr


def test_a_corrupted_ledger_is_one_line_naming_the_fix(tmp_path):
    repo = score_repo(tmp_path / "r")
    assert ratchet(repo, "run", "--rounds", "1").returncode == 0
    db = repo / ".ratchet" / "ledger.db"
    for extra in (db.with_name("ledger.db-wal"), db.with_name("ledger.db-shm")):
        extra.unlink(missing_ok=True)
    db.write_bytes(b"this is not a database" * 200)
    for args in (("status",), ("run",)):
        proc = ratchet(repo, *args)
        out = no_traceback(proc)
        assert proc.returncode == 2, out
        assert "ledger .ratchet/ledger.db is corrupted" in out and "mv .ratchet" in out
        assert len(proc.stderr.strip().splitlines()) <= 2, proc.stderr


def test_a_locked_ledger_names_the_holder_and_the_fix(tmp_path):
    path = tmp_path / "ledger.db"
    Ledger(path).close()
    holder = sqlite3.connect(str(path), isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        waiter = sqlite3.connect(str(path), timeout=0.1)
        with pytest.raises(sqlite3.OperationalError) as caught:  # the driver's next write
            waiter.execute("INSERT INTO meta (key, value) VALUES ('round', '2')")
        waiter.close()
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    fault = infra.as_fault(caught.value)
    assert fault is not None
    assert "is locked by another process" in str(fault) and "fuser" in str(fault)


@pytest.mark.skipif(shutil.which("bwrap") is None or not sandbox.bwrap_works(),
                    reason="needs bubblewrap to make .git/objects read-only for root")
def test_a_read_only_object_store_is_a_fault_not_a_rejection(tmp_path):
    repo = score_repo(tmp_path / "r", backend='[backend]\nkind = "local"\nslots = 2\n'
                      'sandbox = "none"\n')
    objects = repo / ".git" / "objects"
    proc = subprocess.run(
        ["bwrap", "--bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
         "--ro-bind", str(objects), str(objects),
         sys.executable, "-m", "ratchet.cli", "run", "--rounds", "1", "--repo", str(repo)],
        capture_output=True, text=True, timeout=200,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    out = no_traceback(proc)
    assert proc.returncode == 2, out
    assert "cannot write to .git/objects: the file system is read-only" in out, out
    assert not [c for c in _cands(repo) if "could not commit" in (c.reasons or "")]
    assert not [c for c in _cands(repo) if c.status == "rejected"]
    # with the object store writable again, the study resumes and the round is proposed
    proc = ratchet(repo, "run", "--rounds", "1")
    assert proc.returncode == 0, proc.stderr


def test_a_write_just_before_the_verdict_is_caught_not_overwritten(tmp_path):
    """A candidate started beside a confirmation runs on while the verdict is made (the
    hold-out, the judge). A write it makes after the pairs' check is overwritten by the
    keep, and every later check then agrees with the state: the verdict must compare the
    trusted keys under its own write lock and move the branch by compare-and-swap (CI saw
    the unsandboxed rolling cheat of tests/reliability/test_rolling.py get through this
    way, as a mere discard)."""
    from ratchet.driver.candidate import study_branch
    from ratchet.driver.config import load_config
    from ratchet.driver.integrity import Guard

    repo = score_repo(tmp_path / "r")
    assert ratchet(repo, "run").returncode == 0
    said: list[str] = []
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        guard = Guard(repo, ledger, "demo", study_branch("demo"), said.append, load_config(repo))
        incumbent, metric = ledger.get("incumbent"), ledger.get("incumbent_metric")
        held = guard.held()  # the state the last check left
        # the running candidate: its own connection to the ledger, its own git
        planted = git(repo, "commit-tree", git(repo, "rev-parse", "HEAD^{tree}"),
                      "-p", incumbent, "-m", "planted")
        db = sqlite3.connect(repo / ".ratchet" / "ledger.db")
        db.execute("UPDATE meta SET value = ? WHERE key = 'incumbent'", (f'"{planted}"',))
        db.execute("UPDATE meta SET value = '0.0001' WHERE key = 'incumbent_metric'")
        db.commit()
        db.close()
        git(repo, "update-ref", "refs/heads/ratchet/demo", planted)
        with ledger.transaction():  # the verdict's write, as settle makes it
            moved = guard.moved_since(held)
        assert sorted(moved) == ["incumbent", "incumbent_metric"]
        assert (ledger.get("incumbent"), ledger.get("incumbent_metric")) == (incumbent, metric)
        assert guard.move_branch(incumbent, held) is False  # it had moved: tampering
        assert git(repo, "rev-parse", "ratchet/demo") == incumbent
        assert guard.move_branch(incumbent, guard.held()) is True  # untouched: no blame
    finally:
        ledger.close()
