"""What the agent proposer knows about the real coding-agent CLIs.

The presets' command lines (checked against Claude Code 2.1.197, Codex CLI 0.171.0 and
aider 0.86.2, the versions scripts/install_agent_clis.sh pins and tests/agent_cli drives),
the files those CLIs leave in the directory they work in, and how to find the line that
explains a failed run in a CLI's output.

Why each preset looks the way it does:
- claude: `-p` runs one prompt unattended. `--permission-mode acceptEdits` lets it edit;
  its Bash tool still asks ("This command requires approval"), and nobody can answer in
  `-p`, so `--allowedTools=Bash` allows it: the agent sandbox, not Claude Code's
  prompts, is what confines the agent. The `=` form matters: `--allowedTools` takes a
  list, and with a space it swallows the prompt that follows. `bypassPermissions` /
  `--dangerously-skip-permissions` are refused when running as root.
- codex: `--full-auto` is gone from `codex exec` (0.171: "unexpected argument"); its
  replacement is `--sandbox workspace-write` (exec never asks for approval).
  `--skip-git-repo-check`: exec refuses a directory that is not a git repository, and
  the agent's directory need not be one.
- aider: it must not commit or edit .gitignore (ratchet takes the change), and must not
  stop to ask or to look for updates.

All three write under their home directory as they run (Claude Code ~/.claude and
~/.claude.json, Codex $CODEX_HOME, aider its history and caches), Codex writes /tmp and
refuses to build its helper binaries under the temporary directory: an agent needs a
writable home, temporary directory and /tmp of its own inside its sandbox.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from pathlib import Path

PRESETS: dict[str, list[str]] = {
    "claude": ["claude", "-p", "--permission-mode", "acceptEdits", "--allowedTools=Bash",
               "{prompt}"],
    "codex": ["codex", "exec", "--sandbox", "workspace-write", "--skip-git-repo-check",
              "{prompt}"],
    "aider": ["aider", "--yes-always", "--no-auto-commits", "--no-gitignore",
              "--no-check-update", "--no-show-release-notes", "--analytics-disable",
              "--no-show-model-warnings", "--no-pretty", "--no-fancy-input",
              "--message-file", "{prompt_file}", "{files}"],
}

# Caches and tool state a CLI (or the checks it runs) leaves behind: never part of a
# change. Directories count whole: aider's repo map lives in .aider.tags.cache.v4/.
JUNK = re.compile(
    r"(^|/)(__pycache__|\.pytest_cache|\.mypy_cache|\.ruff_cache|\.aider[^/]*|\.claude|\.codex)"
    r"(/|$)|\.py[co]$")

# A line that states a failure, as the CLIs word it ("error: unexpected argument ...",
# "Error: ...", "API Error: 401 ...", "fatal: ...", a Python exception's last line).
_ERROR_LINE = re.compile(r"^\s*(\[?(error|fatal|panic)\b|[\w.]*(Error|Exception)\b[:\s]|api error\b)",
                         re.IGNORECASE)
_LOGGED_ERROR = re.compile(r"\bERROR\b")  # a log record's level, as Codex writes them
# Where a CLI's usage text starts: what follows explains how to call it, not what failed.
_USAGE = re.compile(r"^\s*(usage:|for more information, try)", re.IGNORECASE)
REASON_CHARS = 300


def failure_reason(output: str) -> str:
    """The line of a failed run's output that says why it failed, else its last lines.

    A CLI's own error line comes first; usage text printed after it (as a CLI does for a
    wrong flag) is left out, so the reason names the flag rather than the `--help` hint.
    """
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    body: list[str] = []
    for line in lines:
        if _USAGE.match(line):
            break
        body.append(line)
    errors = [line for line in body if _ERROR_LINE.search(line) or _LOGGED_ERROR.search(line)]
    if errors:
        return errors[-1][-REASON_CHARS:]
    return " | ".join((body or lines)[-3:])[-REASON_CHARS:]



# -- where each CLI's model lives (the agent's allow-listing proxy lets these through) -----

# The API host each CLI talks to when nothing else is configured.
API_HOSTS: dict[str, tuple[str, ...]] = {
    "claude": ("api.anthropic.com:443",),
    "codex": ("api.openai.com:443", "chatgpt.com:443"),
    "aider": ("api.openai.com:443", "api.anthropic.com:443"),
}
# Variables that name a proxy: the agent's own route out, never an endpoint it may reach.
_PROXY_VARS = re.compile(r"(?i)^(all|https?|no)_proxy$")
_URL = re.compile(r"^(https?)://[^\s/]+", re.IGNORECASE)


def model_endpoints(command: str, env: Mapping[str, str]) -> list[str]:
    """The `host:port`s an agent's model lives at: its CLI's API host, every URL the user
    hands it in `[agent] env` (ANTHROPIC_BASE_URL, OPENAI_API_BASE...), and the
    `base_url`s of the Codex configuration it gets (CODEX_HOME/config.toml)."""
    found = list(API_HOSTS.get(Path(command).name, ()))
    for name, value in env.items():
        if not _PROXY_VARS.match(name) and (url := _URL.match(value.strip())):
            found.append(url.group(0))
    codex = env.get("CODEX_HOME")
    if codex:
        found += _codex_base_urls(Path(codex) / "config.toml")
    return found


def _codex_base_urls(path: Path) -> list[str]:
    try:
        config = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return []
    urls = []
    for provider in (config.get("model_providers") or {}).values():
        if isinstance(provider, dict) and isinstance(provider.get("base_url"), str):
            urls.append(provider["base_url"])
    return urls


def upstream_proxy(env: Mapping[str, str]) -> str | None:
    """The proxy the user's own setup goes through (`HTTPS_PROXY` in `[agent] env`): the
    agent's allowed traffic still leaves through it."""
    for name in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy", "HTTP_PROXY",
                 "http_proxy"):
        if env.get(name):
            return env[name]
    return None
