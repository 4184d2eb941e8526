"""Claude Code and Codex, as installed from their registry packages, driving a study through
`ratchet mcp` (issue 37): the agent-driven mode where the person runs the agent.

Each CLI runs in an empty directory of its own (no repository, no .git, no .ratchet), is
configured with what `ratchet mcp --print-config` prints (Claude Code: the `claude mcp
add` line, run there; Codex: the table, in its config.toml), and talks to a scripted
model on loopback in its own API (tests/agent_server.py). The script calls the tools as an
agent following program.md would: `study`, `files`, `submit` of 2 candidates (X = 1.25,
the quadratic's minimum, and X = 5.0, worse), `wait`, `history`. The study must record
both with proposer `mcp`, keep the real improvement, discard the other, and move its
branch only to the kept commit.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from agent_cli_kit import LoopbackCA, cli, codex_home
from agent_server import AgentServer, Call, Say, Turn
from helpers import ROOT, git, score_repo

from ratchet.mcp.config import Client, config_text
from ratchet.store.ledger import Ledger

BETTER, WORSE = "X = 1.25  # the knob", "X = 5.0  # the knob"
BEFORE = "X = 3.0  # the knob"
PROMPT = ("Improve the study with the ratchet tools: call study, read the files, submit two "
          "candidates, wait for their verdicts, then read the history.")
CLI_TIMEOUT = 400


def tool_call(turn: Turn, tool: str, arguments: dict) -> Call:
    """A call of the server's TOOL under the name the CLI offers it: Claude Code's
    mcp__ratchet__study, or `study` in Codex's Responses namespace mcp__ratchet."""
    tools = offered(turn)
    for name, spec in tools.items():
        if "ratchet" in name and name.endswith(f"__{tool}"):
            return Call(name, arguments)
        if spec.get("type") == "namespace" and "ratchet" in name and any(
                t.get("name") == tool for t in spec.get("tools") or []):
            return Call(tool, arguments, namespace=name)
    raise AssertionError(f"the CLI offers no ratchet tool {tool!r}: {sorted(tools)}")


def tool_json(results: list[str]) -> list[str]:
    """The ratchet tools' JSON objects among a turn's tool results (Codex puts a
    "Wall time: ... Output:" header before each; a waiting step has none)."""
    out = []
    for text in results:
        start = 0 if text.startswith("{") else text.find("\n{") + 1
        if start or text.startswith("{"):
            out.append(text[start:])
    return out


def offered(turn: Turn) -> dict[str, dict]:
    return {t["name"]: t for t in turn.body.get("tools") or [] if isinstance(t, dict)
            and "name" in t}


def script(turn: Turn) -> Say | Call:
    """The agent: one tool call a turn, each from what the last ones returned. A CLI whose
    MCP server is still starting offers a tool to wait for it (Claude Code): used first."""
    tools = offered(turn)
    if not any("ratchet" in name for name in tools):
        if "WaitForMcpServers" in tools:  # Claude Code
            return Call("WaitForMcpServers", {})
        if "exec_command" in tools and len(turn.tool_results) < 30:  # Codex: time passes
            return Call("exec_command", {"cmd": "sleep 2"})
    if len(turn.tool_results) > 40:
        return Say("Giving up: the tools never answered as expected.")
    done = tool_json(turn.tool_results)
    step = len(done)
    if step == 0:
        return tool_call(turn, "study", {})
    if step == 1:
        return tool_call(turn, "files", {"paths": ["solution.py"]})
    if step in (2, 3):
        source = json.loads(done[1])["files"]["solution.py"]
        new = BETTER if step == 2 else WORSE
        return tool_call(turn, "submit", {
            "files": {"solution.py": source.replace(BEFORE, new)},
            "description": f"move X: {new.split('  #')[0]}"})
    if step == 4:
        ids = [json.loads(done[2])["id"], json.loads(done[3])["id"]]
        return tool_call(turn, "wait", {"ids": ids, "timeout": 300})
    if step == 5:
        return tool_call(turn, "history", {"n": 10})
    return Say("Kept the better candidate; the history is read. Next round would follow.")


def check_study(repo: Path, agent_dir: Path, start: str, results: list[str]) -> None:
    assert len(results) == 6, results
    verdicts = {v["id"]: v for v in json.loads(results[4])["verdicts"]}
    better, worse = (json.loads(results[i])["id"] for i in (2, 3))
    assert verdicts[better]["status"] == "keep", verdicts
    assert verdicts[worse]["status"] == "discard", verdicts
    history = json.loads(results[5])["candidates"]
    assert {c["id"]: c["proposer"] for c in history if c["kind"] == "candidate"} == {
        better: "mcp", worse: "mcp"}
    rows = [c for c in Ledger(repo / ".ratchet" / "ledger.db").candidates()
            if c.kind == "candidate"]
    assert [(c.id, c.proposer) for c in rows] == [(better, "mcp"), (worse, "mcp")]
    # the branch moved only through the judge; the user's checkout is untouched
    assert git(repo, "rev-parse", "ratchet/demo") == verdicts[better]["commit"]
    assert BETTER in git(repo, "show", "ratchet/demo:solution.py")
    assert git(repo, "rev-parse", "HEAD") == start
    assert git(repo, "status", "--porcelain") == ""
    # the agent's side never held the study
    assert not (agent_dir / ".git").exists() and not (agent_dir / ".ratchet").exists()
    assert not any(p.name in (".git", ".ratchet") for p in agent_dir.rglob("*"))


def setup(tmp_path: Path) -> tuple[Path, Path, str, Path]:
    repo = score_repo(tmp_path / "repo", search="", knobs="")
    agent_dir = tmp_path / "agent"
    agent_dir.mkdir()
    home = tmp_path / "home"
    home.mkdir()
    return repo, agent_dir, git(repo, "rev-parse", "HEAD"), home


def run_cli(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])
    proc = subprocess.run(argv, cwd=cwd, env={**os.environ, **env, "PATH": path},
                          capture_output=True, text=True, timeout=CLI_TIMEOUT,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_claude_code_drives_the_study_through_mcp(tmp_path, test_ca: LoopbackCA):
    claude = cli("claude")
    repo, agent_dir, start, home = setup(tmp_path)
    env = {"HOME": str(home), "ANTHROPIC_API_KEY": "sk-ant-test",
           "NODE_EXTRA_CA_CERTS": str(test_ca.ca), "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
           "MCP_TIMEOUT": "60000", "MCP_TOOL_TIMEOUT": "360000"}
    # the line `ratchet mcp --print-config claude` prints, run where the agent will run,
    # with this checkout's ratchet on PYTHONPATH (`-e` is claude mcp add's own option)
    line = shlex.split(config_text(Client.CLAUDE, repo))
    assert line[:4] == ["claude", "mcp", "add", "ratchet"], line
    added = run_cli([str(claude), *line[1:4], "-e", f"PYTHONPATH={ROOT / 'src'}", *line[4:]],
                    agent_dir, env)
    assert "ratchet" in added.stdout + added.stderr
    with AgentServer(script, tls=(test_ca.cert, test_ca.key)) as server:
        tools = ",".join(f"mcp__ratchet__{t}" for t in ("study", "files", "submit", "wait",
                                                         "history"))
        run_cli([str(claude), "-p", PROMPT, f"--allowedTools={tools}"], agent_dir,
                {**env, "ANTHROPIC_BASE_URL": server.url})
    main = server.main_turns
    check_study(repo, agent_dir, start, tool_json(main[-1].tool_results))


def test_codex_drives_the_study_through_mcp(tmp_path, test_ca: LoopbackCA):
    codex = cli("codex")
    repo, agent_dir, start, home = setup(tmp_path)
    with AgentServer(script, tls=(test_ca.cert, test_ca.key)) as server:
        table = f'{config_text(Client.CODEX, repo)}\n\n[mcp_servers.ratchet.env]\n' \
                f'PYTHONPATH = "{ROOT / "src"}"\n'
        config = codex_home(tmp_path, server.url, more=f"\n{table}")
        run_cli([str(codex), "exec", "--skip-git-repo-check", "--sandbox", "read-only", PROMPT],
                agent_dir, {"HOME": str(home), "CODEX_HOME": str(config),
                            "OPENAI_API_KEY": "sk-test", "SSL_CERT_FILE": str(test_ca.ca)})
    main = server.main_turns
    assert main and all(t.api == "responses" for t in main)
    check_study(repo, agent_dir, start, tool_json(main[-1].tool_results))
