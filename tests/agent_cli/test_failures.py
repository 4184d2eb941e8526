"""A CLI that fails says why in its candidate's reason: its own error line, not usage text."""

from __future__ import annotations

import os

from agent_cli_kit import AGENTS_BIN, cli
from helpers import git, score_repo

from ratchet.config import load_config
from ratchet.proposers import ProposalContext
from ratchet.proposers.agent import AgentProposer
from ratchet.proposers.agent_clis import failure_reason


def test_codex_with_the_removed_flag_says_which_flag(tmp_path, monkeypatch):
    """The old preset's `codex exec --full-auto`: the reason is clap's error line."""
    cli("codex")
    monkeypatch.setenv("PATH", f"{AGENTS_BIN}{os.pathsep}{os.environ['PATH']}")
    repo = score_repo(tmp_path / "r", search='[search]\nproposer = "agent"\n',
                      knobs='[agent]\ncommand = ["codex", "exec", "--full-auto", "{prompt}"]\n')
    config = load_config(repo)
    (repo / ".ratchet").mkdir()
    ctx = ProposalContext(repo=repo, state_dir=repo / ".ratchet", config=config, study="demo",
                          round=1, incumbent=git(repo, "rev-parse", "HEAD"),
                          incumbent_metric=3.0625, history=[], ideas=[])
    [proposal] = AgentProposer(config, []).propose(1, ctx)
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
