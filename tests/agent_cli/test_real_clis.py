"""Claude Code, Codex and aider, as installed from their registry packages, through `ratchet run`.

Each CLI talks to a scripted model on loopback in its own API (tests/agent_server.py),
over HTTPS signed by a private CA, through an HTTPS_PROXY on loopback: the CLI reaches it
only through the CA and proxy variables the test names in `[agent] env`
(NODE_EXTRA_CA_CERTS or SSL_CERT_FILE, HTTPS_PROXY), as behind a TLS-re-signing proxy.
the script makes it read the editable file, edit it with its own edit tool or format,
and (where the CLI runs commands) run the evaluator as the quick check the agent's
instructions allow. The task is the quadratic one: score = (X - 1.25)^2, X = 3.0 at the
start, so the agent's X = 1.25 is really better and must be kept. How long each run took
is printed (`pytest -s`) and asserted to stay well inside the agent's timeout.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from agent_cli_kit import AGENTS_BIN, LoopbackCA, SandboxLevel, cli, codex_home
from agent_server import AgentServer, Call, ConnectProxy, Say, Turn
from helpers import git, ratchet, results_tsv, score_repo

from ratchet.store.ledger import Ledger

BEFORE, AFTER = "X = 3.0  # the knob", "X = 1.25  # the knob"
DESCRIPTION = "move X to the minimum of the quadratic"
AGENT_TIMEOUT = 180


def study_repo(tmp_path: Path, agent_toml: str) -> Path:
    return score_repo(
        tmp_path / "repo",
        search='[search]\nproposer = "agent"\nparallel = 1\nrounds = 2\n',
        knobs=agent_toml,
        backend='[backend]\nkind = "local"\nslots = 1\n')


def run_study(repo: Path, env: dict[str, str], cli_name: str, server: AgentServer,
              level: SandboxLevel) -> dict:
    """`ratchet run` as a user would start it, with every model request through a proxy; the
    agent candidate's row, its log and the run's time."""
    with ConnectProxy() as proxy:
        # the CLIs first, then this interpreter's directory: the agent's `python` check runs
        # the project's Python, as in a user's activated virtual environment
        path = os.pathsep.join([*level.path, str(AGENTS_BIN), str(Path(sys.executable).parent),
                                os.environ["PATH"]])
        env = {**env, "HTTPS_PROXY": proxy.url, "PATH": path}
        start = time.monotonic()
        proc = ratchet(repo, "run", env=env, timeout=AGENT_TIMEOUT + 120)
        seconds = time.monotonic() - start
    assert f"127.0.0.1:{server.port}" in proxy.tunnels, "the CLI went through HTTPS_PROXY"
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    rows = [c for c in Ledger(repo / ".ratchet" / "ledger.db").candidates()
            if c.proposer == "agent"]
    assert len(rows) >= 1, proc.stdout
    row = rows[0]
    log = Path(row.params["agent"]["log"]).read_text() if row.params.get("agent") else ""
    assert row.status == "keep", f"{row.status}: {row.reasons}\n--- agent log ---\n{log[-3000:]}"
    assert row.params["agent"].get("sandbox") == level.name  # it ran in the agent sandbox
    agent_seconds = row.params["agent"]["seconds"]
    print(f"\n{cli_name} ({level.name}): agent {agent_seconds:.1f} s, "
          f"whole `ratchet run` {seconds:.1f} s")
    assert agent_seconds < AGENT_TIMEOUT / 2
    # the user's view: the kept row in results.tsv and the edit on the study branch
    kept = [r for r in results_tsv(repo) if r["status"] == "keep"]
    assert any(DESCRIPTION in r["description"] for r in kept), kept
    assert AFTER in git(repo, "show", "ratchet/demo:solution.py")
    assert git(repo, "diff", "--name-only", row.parent, row.commit_sha) == "solution.py"
    assert git(repo, "status", "--porcelain", "--untracked-files=no") == ""  # checkout untouched
    return {"row": row, "log": log, "seconds": seconds}


# -- Claude Code: Anthropic Messages, streamed, with tool use ---------------------------------

def claude_script(turn: Turn) -> Say | Call:
    cwd = re.search(r"Primary working directory: (.+?)\\n", turn.text)
    assert cwd, "Claude Code's system prompt names its working directory"
    path = f"{cwd.group(1)}/solution.py"
    steps = [Call("Read", {"file_path": path}),
             Call("Edit", {"file_path": path, "old_string": BEFORE, "new_string": AFTER}),
             Call("Bash", {"command": "python evaluate.py", "description": "Run the evaluator"})]
    done = turn.tool_results
    if len(done) < len(steps):
        return steps[len(done)]
    return Say(f"The evaluator now prints: {done[-1].strip()}\n\nDESCRIPTION: {DESCRIPTION}")


def test_claude_code_edit_is_kept(tmp_path, test_ca: LoopbackCA, level: SandboxLevel):
    cli("claude")
    with AgentServer(claude_script, tls=(test_ca.cert, test_ca.key)) as server:
        repo = study_repo(tmp_path, '[agent]\npreset = "claude"\ntimeout = "180s"\n'
                          'env = ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "NODE_EXTRA_CA_CERTS", '
                          '"HTTPS_PROXY", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"]\n')
        run = run_study(repo, {"ANTHROPIC_API_KEY": "sk-ant-test", "ANTHROPIC_BASE_URL": server.url,
                               "NODE_EXTRA_CA_CERTS": str(test_ca.ca),
                               "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}, "claude", server, level)
    main = server.main_turns
    assert main and all(t.body.get("stream") for t in main), "Claude Code streams its turns"
    results = main[-1].tool_results
    assert BEFORE in results[0]  # Read saw the file
    assert "requires approval" not in results[2], results[2]
    assert "score: 0.000000" in results[2]  # the quick check ran, on the edited file
    assert run["row"].params["agent"]["command"] == "claude"


# -- Codex: the OpenAI Responses API, streamed, with function calls ---------------------------

PATCH = f"""apply_patch <<'PATCH'
*** Begin Patch
*** Update File: solution.py
@@
-{BEFORE}
+{AFTER}
*** End Patch
PATCH
"""


def codex_script(turn: Turn) -> Say | Call:
    steps = [Call("exec_command", {"cmd": "cat solution.py"}),
             Call("exec_command", {"cmd": PATCH}),
             Call("exec_command", {"cmd": "python evaluate.py"})]
    done = turn.tool_results
    if len(done) < len(steps):
        return steps[len(done)]
    return Say(f"Checked: {done[-1].strip()[-200:]}\n\nDESCRIPTION: {DESCRIPTION}")


def test_codex_edit_is_kept(tmp_path, test_ca: LoopbackCA, level: SandboxLevel):
    cli("codex")
    with AgentServer(codex_script, tls=(test_ca.cert, test_ca.key)) as server:
        repo = study_repo(tmp_path, '[agent]\npreset = "codex"\ntimeout = "180s"\n'
                          'env = ["OPENAI_API_KEY", "CODEX_HOME", "SSL_CERT_FILE", "HTTPS_PROXY"]\n')
        run = run_study(repo, {"OPENAI_API_KEY": "sk-test",
                               "SSL_CERT_FILE": str(test_ca.ca),
                               "CODEX_HOME": str(codex_home(tmp_path, server.url))}, "codex", server, level)
    main = server.main_turns
    assert main and all(t.api == "responses" and t.body.get("stream") for t in main)
    results = main[-1].tool_results
    assert BEFORE in results[0]
    assert "Success. Updated the following files" in results[1], results[1]
    assert "score: 0.000000" in results[2], results[2]  # the check ran inside Codex's sandbox
    assert "unexpected argument" not in run["log"]


# -- aider: OpenAI Chat Completions, streamed, in aider's own edit format ----------------------

def aider_script(turn: Turn) -> Say:
    system = turn.body["messages"][0]["content"]
    if "SEARCH/REPLACE" in system:  # the diff edit format
        edit = f"solution.py\n```python\n<<<<<<< SEARCH\n{BEFORE}\n=======\n{AFTER}\n" \
               ">>>>>>> REPLACE\n```\n"
    else:  # the whole-file format aider uses for a model it does not know
        current = re.search(r"solution\.py\n```[^\n]*\n(.*?)```", turn.messages_text, re.DOTALL)
        assert current, "aider sends the file's contents"
        edit = f"solution.py\n```python\n{current.group(1).replace(BEFORE, AFTER)}```\n"
    return Say(f"Moving X to the vertex.\n\n{edit}\nDESCRIPTION: {DESCRIPTION}\n")


def test_aider_edit_is_kept_without_its_cache(tmp_path, test_ca: LoopbackCA,
                                             level: SandboxLevel):
    cli("aider")
    with AgentServer(aider_script, tls=(test_ca.cert, test_ca.key)) as server:
        repo = study_repo(tmp_path, '[agent]\npreset = "aider"\ntimeout = "180s"\n'
                          'env = ["OPENAI_API_KEY", "OPENAI_API_BASE", "AIDER_MODEL", '
                          '"SSL_CERT_FILE", "HTTPS_PROXY", "LITELLM_LOCAL_MODEL_COST_MAP"]\n')
        run = run_study(repo, {"OPENAI_API_KEY": "sk-test", "OPENAI_API_BASE": f"{server.url}/v1",
                               "SSL_CERT_FILE": str(test_ca.ca),
                               "AIDER_MODEL": "openai/ratchet-test",
                               "LITELLM_LOCAL_MODEL_COST_MAP": "True"}, "aider", server, level)
    main = server.main_turns
    assert main and all(t.api == "chat" for t in main)
    assert "Applied edit to solution.py" in run["log"]
    row = run["row"]
    files = git(repo, "ls-tree", "-r", "--name-only", row.commit_sha).splitlines()
    assert not [f for f in files if ".aider" in f], files  # its cache and history stay out


def test_versions_are_the_pinned_ones():
    """The CLIs the tests ran are the versions the install script pins."""
    script = (Path(__file__).resolve().parents[2] / "scripts" / "install_agent_clis.sh").read_text()
    pins = dict(re.findall(r"^(\w+)_VERSION=(\S+)$", script, re.MULTILINE))
    for name, pin in (("claude", "CLAUDE_CODE"), ("codex", "CODEX"), ("aider", "AIDER")):
        exe = cli(name)
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True,
                             timeout=60).stdout
        assert pins[pin] in out, (name, out, pins)
