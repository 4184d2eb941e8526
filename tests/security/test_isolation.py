"""Secrets stay out of candidates' reach: scrubbed workers, PID namespaces, declared keys.

Each test runs a real study through the CLI on a temp repository; the candidate code is
the attacker: it reads its environment, or every `/proc/<pid>/environ` it can see.
"""

from __future__ import annotations

import json
import uuid

import pytest
from helpers import config_text, make_repo, ratchet, without_bwrap

from ratchet.job import sandbox
from ratchet.store.ledger import Ledger

# The evaluator itself is the attacker's stand-in here: it runs where candidate code runs
# (same sandbox, same environment) and reports what it could see.
SCANNER = '''
import json, os, sys
secret = sys.argv[1].encode()
seen, workers, leaks, worker_leaks = 0, 0, [], []
for pid in os.listdir("/proc"):
    if not pid.isdigit():
        continue
    try:
        env = open(f"/proc/{pid}/environ", "rb").read()
        cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ")
    except OSError:
        continue
    seen += 1
    workers += b"ratchet.job.worker" in cmd
    if secret in env:
        leaks.append(cmd.decode(errors="replace")[:120])
        if b"ratchet.job.worker" in cmd:
            worker_leaks.append(pid)
json.dump({"leaks": leaks}, open(os.path.join(os.environ["RATCHET_WORKDIR"], "scan.json"), "w"))
print("correct: true")
print(f"score: {1.0 if MODE == 'base' else 0.5}")
print(f"visible_processes: {seen}")
print(f"leaks: {len(leaks)}")
print(f"worker_leaks: {len(worker_leaks)}")
print(f"workers_seen: {workers}")
'''


def scan_repo(path, secret: str, sandbox_mode: str):
    task = config_text().split("[task.metric]")[0].replace(
        'evaluate = "python evaluate.py"', f'evaluate = "python evaluate.py {secret}"')
    return make_repo(path, {
        "ratchet.toml": config_text(
            task=task,
            knobs='[tune.knobs]\n"solution.py:MODE" = { choices = ["cand"] }\n',
            search="[search]\nparallel = 2\nrounds = 1\n",
            backend=f'[backend]\nkind = "local"\nslots = 2\nsandbox = "{sandbox_mode}"\n'),
        "solution.py": "MODE = 'base'\n",
        "evaluate.py": "from solution import MODE\n" + SCANNER,
    })


def extras(repo) -> list[dict]:
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        return [c.extra or {} for c in ledger.candidates()]
    finally:
        ledger.close()


@pytest.mark.parametrize("level", ["bwrap", "pidns"])
def test_scanning_proc_environ_finds_no_driver_key(tmp_path, level):
    if level == "bwrap" and not sandbox.bwrap_works():
        pytest.skip("bubblewrap does not work here")
    if level == "pidns" and sandbox.unshare_prefix() is None:
        pytest.skip("unshare cannot make a PID namespace here")
    secret = f"sk-live-{uuid.uuid4().hex}"
    repo = scan_repo(tmp_path / "r", secret, "auto")
    env = {"OPENAI_API_KEY": secret, "MY_LLM_KEY": secret,
           **(without_bwrap(tmp_path) if level == "pidns" else {})}
    proc = ratchet(repo, "run", env=env)
    assert proc.returncode == 0, proc.stderr
    found = extras(repo)
    assert len(found) == 2 and all("leaks" in e for e in found), found
    assert [e["leaks"] for e in found] == [0, 0]
    # it saw only its own processes: no driver, no standby workers, no other job
    assert all(e["visible_processes"] <= 4 for e in found), found
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    assert {c.result["sandbox"] for c in ledger.candidates()} == {level}
    ledger.close()
    status = json.loads(ratchet(repo, "status", "--json", env=env).stdout)["sandbox"]
    assert ("pid namespace only" if level == "pidns" else "own PID namespace") in status


def test_workers_start_from_a_scrubbed_environment(tmp_path):
    """Without any isolation (sandbox = "none") a candidate can read every process's
    environment: the workers (standby ones included) must not hold the driver's keys."""
    secret = f"sk-live-{uuid.uuid4().hex}"
    repo = scan_repo(tmp_path / "r", secret, "none")
    proc = ratchet(repo, "run", env={"OPENAI_API_KEY": secret, "MY_LLM_KEY": secret})
    assert proc.returncode == 0, proc.stderr
    found = extras(repo)
    # the baseline and the candidate, and any confirmation pairs measured beside them
    assert len(found) >= 2 and all("worker_leaks" in e for e in found), found
    assert all(e["worker_leaks"] == 0 for e in found), found
    assert all(e["workers_seen"] >= 1 for e in found), found  # its own worker, at least
    scans = [json.loads(p.read_text()) for p in (repo / ".ratchet" / "jobs").glob("*/work/scan.json")]
    assert len(scans) >= len(found)  # confirmation pairs are jobs too, not candidates
    for scan in scans:  # whatever leaked is the driver itself (the `ratchet run` process)
        assert all("ratchet.cli" in cmd for cmd in scan["leaks"]), scan


def test_status_says_plainly_what_isolates(tmp_path):
    repo = scan_repo(tmp_path / "r", "x", "auto")
    line = json.loads(ratchet(repo, "status", "--json").stdout)["sandbox"]
    assert line == sandbox.describe()
    kind = sandbox.choose("auto")
    assert {"bwrap": "bwrap", "pidns": "pid namespace", "none": "NO ISOLATION"}[kind] in line


def test_a_declared_key_name_never_reaches_candidates(tmp_path):
    """api_key_env = "RATCHET_LLM_KEY": allow-listed by prefix, still never passed on."""
    evaluate = '''
import os
with open(os.path.join(os.environ["RATCHET_WORKDIR"], "env.json"), "w") as fh:
    import json
    json.dump(dict(os.environ), fh)
from solution import MODE
print("correct: true")
print(f"score: {1.0 if MODE == 'base' else 0.5}")
'''
    task = config_text().split("[task.metric]")[0] + 'env = ["RATCHET_LLM_KEY", "OTHER_KEY_NAME"]\n'
    llm = ('[llm]\nmodels = [{ provider = "openai", model = "m", '
           'api_key_env = "RATCHET_LLM_KEY" }, { provider = "openai", model = "n", '
           'api_key_env = "OTHER_KEY_NAME" }]\n'
           '[backend]\nkind = "local"\nslots = 2\n')
    repo = make_repo(tmp_path / "r", {
        "ratchet.toml": config_text(
            task=task, backend=llm,
            knobs='[tune.knobs]\n"solution.py:MODE" = { choices = ["cand"] }\n',
            search="[search]\nparallel = 2\nrounds = 1\n"),
        "solution.py": "MODE = 'base'\n",
        "evaluate.py": evaluate,
    })
    secret = f"llm-{uuid.uuid4().hex}"
    proc = ratchet(repo, "run", env={"RATCHET_LLM_KEY": secret, "OTHER_KEY_NAME": secret,
                                     "RATCHET_VISIBLE_SETTING": "shown"})
    assert proc.returncode == 0, proc.stderr
    envs = [json.loads(p.read_text()) for p in (repo / ".ratchet" / "jobs").glob("*/work/env.json")]
    assert len(envs) >= 2  # the baseline and the candidate (and any confirmation pairs)
    for env in envs:
        assert "RATCHET_LLM_KEY" not in env and "OTHER_KEY_NAME" not in env
        assert secret not in json.dumps(env)
        assert env["RATCHET_VISIBLE_SETTING"] == "shown"  # the prefix still passes the rest
