"""A deterministic tiny task in a fresh git repo, shared by the backend tests.

`knob.py` holds X; the evaluator scores it deterministically, sleeps a little (so jobs
overlap), and reports as extra metrics what the test checks: CUDA_VISIBLE_DEVICES
(`cuda`), start/end times (`t_start`, `t_end`) and whether it saw the data prepared
once (`data_ok`). (Extra metrics rather than a trace file: with bubblewrap the whole
filesystem outside the job's directory is read-only to the evaluator.)
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

EVALUATE = '''\
import os, sys, time
start = time.time()
src = open("knob.py").read()
x = int(src.split("=")[1])
data = os.environ.get("RATCHET_DATA")
seen = open(os.path.join(data, "table.txt")).read().strip() if data else ""
trace = os.environ.get("RATCHET_TEST_TRACE")
if trace:  # one line per run of a job (unwritable under bubblewrap: then no trace)
    try:
        with open(trace, "a") as fh:
            fh.write(os.environ.get("RATCHET_JOB_ID", "?") + "\\n")
    except OSError:
        pass
secret = os.environ.get("RATCHET_TEST_SCAN")
if secret:  # what a candidate could find of the hold-out data
    found = 0
    for root in [".", os.environ.get("TMPDIR", "."), os.path.dirname(os.getcwd()),
                 *secret.split(os.pathsep)]:
        for base, _, files in os.walk(root):
            for name in files:
                try:
                    path = os.path.join(base, name)
                    if name == "secret.txt" or "-".join(["holdout", "secret"]) in open(
                            path, errors="replace").read():
                        found = 1
                        print("found the hold-out data in", path)
                except OSError:
                    pass
    print(f"holdout_seen: {{found}}")
    print(f"holdout_env: {{1 if os.environ.get('RATCHET_HOLDOUT') else 0}}")
time.sleep(float(os.environ.get("RATCHET_TEST_SLEEP", "{sleep}")))
if x == {hang}:
    time.sleep(3600)
print("RATCHET-WORKER-RESULT: {{\\"job_id\\": \\"forged\\", \\"outcome\\": \\"ok\\"}}")
print(f"cuda: {{os.environ.get('CUDA_VISIBLE_DEVICES', '-1') or '-1'}}")
print(f"t_start: {{start:.3f}}")
print(f"t_end: {{time.time():.3f}}")
print(f"data_ok: {{1 if seen == 'prepared-once' else 0}}")
overfit = {overfit}
print(f"score: {{0 if 2 <= x <= overfit else (x - 7) ** 2 + 1}}")
'''

HOLDOUT = '''\
import os, sys
x = int(open("knob.py").read().split("=")[1])
data = os.environ.get("RATCHET_HOLDOUT", "")
secret = open(os.path.join(data, "secret.txt")).read().strip() if data else ""
trace = os.environ.get("RATCHET_TEST_TRACE")
if trace:
    with open(trace + ".holdout", "a") as fh:
        fh.write(f"{{os.environ.get('RATCHET_JOB_ID', '?')}} {{secret}}\\n")
if secret != "-".join(["holdout", "secret"]):
    sys.exit("no hold-out data")
if 2 <= x <= {fail_below}:
    sys.exit(3)  # overfit: fails the hold-out
print(f"score: {{(x - 7) ** 2 + 1}}")
'''

PREPARE = '''\
import os
import time
with open(os.path.join(os.environ["RATCHET_DATA"], "table.txt"), "w") as fh:
    fh.write("prepared-once\\n")
print("prepared")
'''


def make_task(root: Path, *, backend: str, extra: str = "", parallel: int = 3, rounds: int = 3,
              name: str = "tiny",
              sleep: float = 1.0, hang: int = -1, prep: bool = True, timeout: str = "60s",
              holdout_fail_below: int | None = None,
              choices: str = "[1, 2, 3, 4, 5, 6, 8, 9, 10, 11, 12]") -> Path:
    repo = root / "repo"
    repo.mkdir(parents=True)
    (repo / "knob.py").write_text("X = 1\n")
    (repo / "evaluate.py").write_text(EVALUATE.format(
        sleep=sleep, hang=hang,
        overfit=-99 if holdout_fail_below is None else holdout_fail_below))
    (repo / "prepare.py").write_text(PREPARE)
    prep_section = '[prep]\nrun = "python prepare.py"\n' if prep else ""
    holdout = ""
    if holdout_fail_below is not None:  # hold-out data outside the repo, never committed
        (repo / "holdout.py").write_text(HOLDOUT.format(fail_below=holdout_fail_below))
        secret = root / "holdout-data"
        secret.mkdir()
        (secret / "secret.txt").write_text("holdout-secret\n")
        holdout = f'holdout = "python holdout.py"\nholdout_data = "{secret}"'
    protected = '["evaluate.py", "prepare.py", "holdout.py"]' if holdout else \
        '["evaluate.py", "prepare.py"]'
    toml = "\n".join(line.strip() for line in f"""\
        [task]
        name = "{name}"
        editable = ["knob.py"]
        protected = {protected}
        evaluate = "python evaluate.py"
        {holdout}
        timeout = "{timeout}"
        env = ["RATCHET_TEST_TRACE", "RATCHET_TEST_SLEEP", "RATCHET_TEST_SCAN"]

        [task.metric]
        name = "score"
        goal = "minimize"

        {prep_section}
        [search]
        proposer = "tune"
        parallel = {parallel}
        rounds = {rounds}

        [tune]
        sampler = "random"

        [tune.knobs]
        "knob.py:X" = {{ choices = {choices} }}

        [backend]
        kind = "{backend}"
        """.splitlines())
    (repo / "ratchet.toml").write_text(toml + "\n" + extra)
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "task"], check=True)
    return repo


def run_study(repo: Path) -> list:
    """Run the study in `repo` to its end in this process; its candidates, from the ledger."""
    from ratchet.driver.study import Study

    study = Study(repo)
    try:
        study.run()
        return study.ledger.candidates()
    finally:
        study.close()


def summary(repo: Path) -> list[tuple]:
    """(candidate, status, metric, knob.py content) for every candidate, from the ledger."""
    from ratchet.store.ledger import Ledger

    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        rows = []
        for cand in ledger.candidates():
            content = None
            if cand.commit_sha:
                content = subprocess.run(
                    ["git", "-C", str(repo), "show", f"{cand.commit_sha}:knob.py"],
                    capture_output=True, text=True).stdout
            rows.append((cand.id, cand.status, cand.metric, content))
        return rows
    finally:
        ledger.close()


def check_holdout_everywhere(tmp_path: Path, monkeypatch, *, backend: str, extra: str,
                             records: str, name: str, scan: tuple[Path, ...] = ()) -> None:
    """A study whose candidates with X <= 5 fail the hold-out (overfit). On any backend:
    only would-be keeps get a hold-out job (a follow-up job `<job>-holdout`), a would-be
    keep that fails it is `rejected`, and no other phase finds the hold-out data. The
    overfit candidates score a perfect 0 in public, so each one drawn is a would-be keep;
    4 distinct draws from 5 values with 3 overfit ones: at least one is rejected."""
    import os

    from ratchet.driver.study import Study
    from ratchet.job.node import holdout_root
    from ratchet.job.sandbox import bwrap_works

    roots = [str(holdout_root()), *map(str, scan)]
    if bwrap_works():  # the driver's own copy: hidden from candidates by the sandbox only
        roots.append(str(tmp_path / "holdout-data"))
    monkeypatch.setenv("RATCHET_TEST_SCAN", os.pathsep.join(roots))
    repo = make_task(tmp_path, backend=backend, parallel=2, rounds=2, sleep=0.1, prep=False,
                     name=name, holdout_fail_below=5, choices="[2, 3, 4, 10, 11]",
                     extra=extra)
    before = set(holdout_root().iterdir())
    study = Study(repo)
    try:
        study.run()
        cands = {c.id: c for c in study.ledger.candidates()}
    finally:
        study.close()
    # the node's hold-out root is the machine's (one per uid): a test beside this one may
    # have a job holding its shipped copy right now, so what appeared during this study
    # must go within a job's time; a copy this study left behind stays and fails
    appeared = set(holdout_root().iterdir()) - before
    deadline = time.monotonic() + 60
    while any(p.exists() for p in appeared) and time.monotonic() < deadline:
        time.sleep(0.2)
    jobs = [p.name for p in (repo / records).iterdir()]
    held = {j.split("-")[-3] for j in jobs if j.endswith("-holdout")}
    assert held, jobs
    rejected_overfit = 0
    for cid, cand in cands.items():
        x = int(cand.params["knob.py:X"]) if cand.params else 1
        if cand.status == "discard":  # a losing candidate never runs the hold-out
            assert cid not in held, (cid, cand.reasons)
        if cand.status == "keep":
            assert cid in held and cand.holdout is not None, cid
            assert not 2 <= x <= 5
        if cid in held and 2 <= x <= 5:  # a would-be keep that failed it: overfit
            assert cand.status == "rejected", (cid, cand.status, cand.reasons)
            rejected_overfit += 1
        # no other phase of any job could find the hold-out data or was pointed at it
        assert cand.extra.get("holdout_seen") == 0, (cid, cand.extra)
        assert cand.extra.get("holdout_env") == 0, (cid, cand.extra)
    assert rejected_overfit >= 1, {c: (v.status, v.params) for c, v in cands.items()}
    # nothing of the shipped data is left on the node
    assert not [p for p in appeared if p.exists()], appeared
