"""A CLI that fails says why in its candidate's reason: its own error line, not usage text."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from pathlib import Path

import psutil
from agent_cli_kit import AGENTS_BIN, cli
from agent_server import AgentServer, Say, Turn
from helpers import git, score_repo

from ratchet.driver.config import load_config
from ratchet.proposers import ProposalContext
from ratchet.proposers.agent import AgentProposer
from ratchet.proposers.agent_clis import failure_reason


def propose_once(repo: Path):
    """One proposal from the [agent] section of `repo`'s ratchet.toml."""
    config = load_config(repo)
    (repo / ".ratchet").mkdir(exist_ok=True)
    ctx = ProposalContext(repo=repo, state_dir=repo / ".ratchet", config=config, study="demo",
                          round=1, incumbent=git(repo, "rev-parse", "HEAD"),
                          incumbent_metric=3.0625, history=[], ideas=[])
    [proposal] = AgentProposer(config, []).propose(1, ctx)
    return proposal


def test_codex_with_the_removed_flag_says_which_flag(tmp_path, monkeypatch):
    """The old preset's `codex exec --full-auto`: the reason is clap's error line."""
    cli("codex")
    monkeypatch.setenv("PATH", f"{AGENTS_BIN}{os.pathsep}{os.environ['PATH']}")
    repo = score_repo(tmp_path / "r", search='[search]\nproposer = "agent"\n',
                      knobs='[agent]\ncommand = ["codex", "exec", "--full-auto", "{prompt}"]\n')
    proposal = propose_once(repo)
    assert proposal.error is not None
    assert proposal.error.startswith("agent exited with code 2: ")
    assert "error: unexpected argument '--full-auto' found" in proposal.error
    assert "Usage:" not in proposal.error and "--help" not in proposal.error


def test_the_error_line_is_found_in_each_clis_wording():
    clap = ("WARNING: proceeding, even though we could not create PATH aliases\n"
            "error: unexpected argument '--full-auto' found\n\n"
            "  tip: to pass '--full-auto' as a value, use '-- --full-auto'\n\n"
            "Usage: codex exec [OPTIONS] [PROMPT]\n\nFor more information, try '--help'.\n")
    assert failure_reason(clap) == "error: unexpected argument '--full-auto' found"
    claude = "API Error: 401 {\"error\":{\"message\":\"invalid x-api-key\"}}\n"
    assert failure_reason(claude).startswith("API Error: 401")
    traceback = ("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
                 "litellm.AuthenticationError: OpenAIException - bad key\n")
    assert failure_reason(traceback) == "litellm.AuthenticationError: OpenAIException - bad key"
    # no error line: the last lines, as before
    assert failure_reason("working\nsomething went wrong\n") == "working | something went wrong"


def test_claude_code_on_a_hung_model_is_killed_at_the_timeout(tmp_path, monkeypatch):
    """The model never answers: Claude Code and everything it started end at the timeout."""
    cli("claude")
    released = threading.Event()
    mark = uuid.uuid4().hex

    def marked() -> list[str]:
        """This test's processes: the ones carrying its mark in their environment (the
        machine may run other studies' agents meanwhile)."""
        found = []
        for proc in psutil.process_iter():
            with contextlib.suppress(psutil.Error):
                if proc.environ().get("RATCHET_TEST_MARK") == mark:
                    found.append(f"{proc.pid} {proc.name()}")
        return found

    while_hung: list[str] = []

    def hang(turn: Turn) -> Say:
        while_hung.extend(marked())
        released.wait(120)
        return Say("too late")

    with AgentServer(hang) as server:
        for name, value in (("ANTHROPIC_API_KEY", "sk-ant-test"),
                            ("ANTHROPIC_BASE_URL", server.url),
                            ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
                            ("RATCHET_TEST_MARK", mark),
                            ("PATH", f"{AGENTS_BIN}{os.pathsep}{os.environ['PATH']}")):
            monkeypatch.setenv(name, value)
        repo = score_repo(tmp_path / "r", search='[search]\nproposer = "agent"\n',
                          knobs='[agent]\npreset = "claude"\ntimeout = "6s"\nenv = '
                                '["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", '
                                '"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "RATCHET_TEST_MARK"]\n')
        start = time.monotonic()
        try:
            proposal = propose_once(repo)
        finally:
            released.set()
        seconds = time.monotonic() - start
    assert server.main_turns, "Claude Code reached the model before it hung"
    assert proposal.error == "agent timed out after 6s; its process tree was killed"
    assert seconds < 30, seconds
    assert while_hung, "the agent's processes are found by their mark"
    left = marked()
    assert left == [], f"the agent's processes outlived the timeout: {left}"
