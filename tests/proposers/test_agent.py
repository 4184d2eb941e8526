"""The agent proposer with small executables standing in for the coding-agent CLIs."""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import context_for, git, ledger_of, make_repo

from ratchet.core.candidate import Proposal
from ratchet.driver.config import load_config
from ratchet.driver.study import Study
from ratchet.proposers import ProposerError
from ratchet.proposers.agent import AgentProposer

FAKE_AGENT = r'''
import os, pathlib, re, subprocess, sys, time

mode, prompt_file = sys.argv[1], sys.argv[2]
prompt = pathlib.Path(prompt_file).read_text()
attempt = int(re.search(r"attempt (\d+) of", prompt).group(1))
print("secret visible:", "SECRET_NOT_PASSED" in os.environ, "key:", os.environ.get("AGENT_KEY"))
if mode == "hang":
    token = sys.argv[3]  # a double fork: the daemon leaves the agent's session and parent
    if os.fork() == 0:
        os.setsid()
        subprocess.Popen([sys.executable, "-c", f"import time; time.sleep(300)  # {token}"])
        os._exit(0)
    time.sleep(300)
if mode == "fail":
    print("something went wrong")
    sys.exit(3)
if mode == "mixed" and attempt == 1:
    pathlib.Path("evaluate.py").write_text('print("score: 0")\n')
    print("DESCRIPTION: make the evaluator report zero")
    sys.exit(0)
if mode == "mixed" and attempt == 2:
    print("DESCRIPTION: thought about it, changed nothing")
    sys.exit(0)
value = {1: 3, 2: 30}[attempt]
path = pathlib.Path("solution.py")
path.write_text(path.read_text().replace("VALUE = 10", f"VALUE = {value}"))
pathlib.Path("__pycache__").mkdir(exist_ok=True)  # junk a tool leaves behind
pathlib.Path("__pycache__/solution.cpython-311.pyc").write_bytes(b"junk")
print(f"DESCRIPTION: agent sets VALUE to {value}")
'''


@pytest.fixture
def fake_agent(tmp_path) -> Path:
    script = tmp_path / "fake_agent.py"
    script.write_text(FAKE_AGENT)
    return script


def agent_toml(script: Path, mode: str, timeout: str = "60s", extra: str = "") -> str:
    return f"""
[agent]
command = ["{sys.executable}", "{script}", "{mode}", "{{prompt_file}}"]
env = ["AGENT_KEY"]
timeout = "{timeout}"
{extra}"""


@pytest.fixture(autouse=True)
def agent_env(monkeypatch):
    monkeypatch.setenv("AGENT_KEY", "key-123")
    monkeypatch.setenv("SECRET_NOT_PASSED", "x")


def test_agents_in_parallel_private_copies_through_a_study(tmp_path, fake_agent):
    repo = make_repo(tmp_path / "r", "agent", agent_toml(fake_agent, "edit"), parallel=3)
    study = Study(repo, backend="local")
    try:
        study.run(rounds=1)
    finally:
        study.close()
    rows = {c.description: c for c in ledger_of(repo).candidates()}
    good, worse = rows["agent sets VALUE to 3"], rows["agent sets VALUE to 30"]
    assert (good.status, good.metric, worse.status, worse.metric) == ("keep", 3, "discard", 30)
    assert good.proposer == "agent" and good.params["agent"]["exit_code"] == 0
    changed = git(repo, "diff", "--name-only", good.parent, good.commit_sha)
    assert changed == "solution.py"  # the __pycache__ junk is not part of the change
    log = Path(good.params["agent"]["log"]).read_text()
    assert "secret visible: False key: key-123" in log  # scrubbed env, named keys only
    prompt = Path(good.context_path).read_text()
    assert "VALUE = 10" in prompt and "DESCRIPTION:" in prompt
    copy = re.search(r"private copy of the repository \((.+?)\)", prompt).group(1)
    assert not Path(copy).is_relative_to(repo)  # outside the user's repository
    assert not Path(copy).exists()  # thrown away once read back
    assert git(repo, "worktree", "list").count("\n") == 0  # no worktree of the user's repo


def test_protected_edit_rejected_and_no_change(tmp_path, fake_agent):
    repo = make_repo(tmp_path / "r", "agent", agent_toml(fake_agent, "mixed"), parallel=3)
    study = Study(repo, backend="local")
    try:
        study.run(rounds=1)
    finally:
        study.close()
    rows = {c.description: c for c in ledger_of(repo).candidates()}
    cheat = rows["make the evaluator report zero"]
    assert cheat.status == "rejected" and "touches protected path evaluate.py" in cheat.reasons
    idle = rows["thought about it, changed nothing"]
    assert idle.status == "rejected" and idle.reasons == "agent made no change"


def test_a_hanging_agent_is_killed_with_its_tree(tmp_path, fake_agent):
    token = f"ratchet-daemon-{os.getpid()}-{time.monotonic_ns()}"
    repo = make_repo(tmp_path / "r", "agent", agent_toml(fake_agent, "hang", timeout="1.5s"))
    config = load_config(repo)
    config.agent["command"].append(token)
    proposer = AgentProposer(config, [])
    start = time.monotonic()
    [proposal] = proposer.propose(1, context_for(repo))
    assert time.monotonic() - start < 15
    assert proposal.error and "timed out after 1.5s" in proposal.error

    def daemons() -> list[psutil.Process]:
        found = []
        for proc in psutil.process_iter(["cmdline", "status"]):
            if token in " ".join(proc.info["cmdline"] or []) and \
                    proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(proc)
        return found

    deadline = time.monotonic() + 5
    while daemons() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not daemons(), "the agent's double-forked daemon survived the timeout"


def test_failing_agent_and_config_errors(tmp_path, fake_agent, monkeypatch):
    repo = make_repo(tmp_path / "r", "agent", agent_toml(fake_agent, "fail"))
    [proposal] = AgentProposer(load_config(repo), []).propose(1, context_for(repo))
    assert proposal.error == "agent exited with code 3: secret visible: False key: key-123 | " \
                             "something went wrong"
    monkeypatch.delenv("AGENT_KEY")
    with pytest.raises(ProposerError, match=r"agent\.env\[0\]: environment variable AGENT_KEY"):
        AgentProposer(load_config(repo), [])
    missing = make_repo(tmp_path / "m", "agent", '[agent]\ncommand = "no-such-agent {prompt_file}"')
    with pytest.raises(ProposerError, match="'no-such-agent' not found on PATH"):
        AgentProposer(load_config(missing), [])
    both = make_repo(tmp_path / "b", "agent", '[agent]\npreset = "claude"\ncommand = "x"\n')
    with pytest.raises(ProposerError, match="agent: give either preset or command"):
        AgentProposer(load_config(both), [])


def test_claude_preset_with_a_stand_in_cli(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    claude = bin_dir / "claude"
    # `claude -p --permission-mode acceptEdits --allowedTools=Bash PROMPT`: check the
    # flags, edit, summarise (tests/agent_cli drives the real one)
    claude.write_text(f"""#!{sys.executable}
import pathlib, sys
assert sys.argv[1:5] == ["-p", "--permission-mode", "acceptEdits", "--allowedTools=Bash"], sys.argv
assert "VALUE = 10" in sys.argv[5]
path = pathlib.Path("solution.py")
path.write_text(path.read_text().replace("VALUE = 10", "VALUE = 1"))
print("Done.\\nDESCRIPTION: claude sets VALUE to 1")
""")
    claude.chmod(0o755)  # runnable by the uid the agent sandbox gives it
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    repo = make_repo(tmp_path / "r", "agent", '[agent]\npreset = "claude"\n')
    [proposal] = AgentProposer(load_config(repo), []).propose(1, context_for(repo))
    assert proposal.error is None, proposal.error
    assert proposal.description == "claude sets VALUE to 1"
    assert list(proposal.files) == ["solution.py"]  # read back from the agent's copy
    assert b"\nVALUE = 1\n" in proposal.files["solution.py"]


REPAIRING_AGENT = r'''
import pathlib, re, sys
prompt = pathlib.Path(sys.argv[1]).read_text()
assert "# Re-apply a change" in prompt
value = re.search(r"(?m)^\+VALUE = (\d+)$", prompt).group(1)  # the change, from its diff
path = pathlib.Path("solution.py")  # the new incumbent's copy
path.write_text(re.sub(r"VALUE = \d+", f"VALUE = {value}", path.read_text()))
print(f"DESCRIPTION: VALUE to {value} again, on the new incumbent")
'''


def test_an_agent_repairs_a_change_onto_a_moved_incumbent(tmp_path):
    script = tmp_path / "repairing_agent.py"
    script.write_text(REPAIRING_AGENT)
    repo = make_repo(tmp_path / "r", "agent", f"""
[agent]
command = ["{sys.executable}", "{script}", "{{prompt_file}}"]
timeout = "60s"
""")
    old = git(repo, "rev-parse", "HEAD")
    # the incumbent moved: the same line changed, and a line the change does not touch
    text = (repo / "solution.py").read_text()
    (repo / "solution.py").write_text(text.replace("VALUE = 10", "VALUE = 8")
                                      .replace("total = VALUE", "total = VALUE * 1"))
    git(repo, "commit", "-qam", "moved")
    proposer = AgentProposer(load_config(repo), [])
    assert proposer.contained  # bubblewrap or a PID namespace here (the driver is root)
    made = Proposal(description="set VALUE to 3", files={"solution.py": text.replace(
        "VALUE = 10", "VALUE = 3").encode()}, calls=[41])
    diff = "--- a/solution.py\n+++ b/solution.py\n@@ -1 +1 @@\n-VALUE = 10\n+VALUE = 3\n"
    ctx = context_for(repo)  # on the new incumbent
    assert ctx.incumbent != old
    got = proposer.repair(made, diff, ctx)
    assert got is not None and got.error is None, got and got.error
    new = got.files["solution.py"].decode()
    assert "VALUE = 3" in new and "total = VALUE * 1" in new  # on top of what moved
    assert got.description == "VALUE to 3 again, on the new incumbent"
    [call] = ledger_of(repo).calls()
    assert call["outcome"] == "repaired" and call["proposer"] == "agent"
    assert got.calls == [41, call["id"]]  # the original's calls, then the repair's
