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
~/.claude.json, Codex $CODEX_HOME, aider its history and caches), and Codex refuses to
build its helper binaries under the temporary directory. `private_home` gives each agent
a fresh writable home and temporary directory of its own inside its sandbox.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
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


# Variables naming a CLI's configuration directory, which the CLI also writes to as it runs.
# When the user names one in `[agent] env`, the agent gets a copy (top-level files only:
# config and credentials, not the sessions and logs beside them), never the directory.
CONFIG_DIRS = {"CODEX_HOME": ".codex", "CLAUDE_CONFIG_DIR": ".claude"}
CONFIG_FILE_BYTES = 1 << 20


def private_home(root: Path, env: Mapping[str, str]) -> dict[str, str]:
    """HOME, TMPDIR and named config directories for one agent, all under `root`.

    `root` is the agent's own writable directory (its scratch copy's root). The home is
    fresh, so the user's own dotfiles and logins stay out of the agent's reach; what it
    needs comes through the variables the user names. TMPDIR is a sibling of the home,
    not its parent: Codex will not create its helper binaries under the temp dir.
    """
    home, tmp = root / "home", root / "tmp"
    for d in (home, tmp):
        d.mkdir(mode=0o700, exist_ok=True)
    out = {"HOME": str(home), "TMPDIR": str(tmp)}
    for name, dotdir in CONFIG_DIRS.items():
        source = env.get(name)
        if source:
            out[name] = str(_copy_config(Path(source), home / dotdir))
    return out


def _copy_config(source: Path, target: Path) -> Path:
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        for entry in os.scandir(source):
            # regular files only, never through a link: the agent gets contents, not paths
            if entry.is_file(follow_symlinks=False) and \
                    entry.stat(follow_symlinks=False).st_size <= CONFIG_FILE_BYTES:
                shutil.copyfile(entry.path, target / entry.name, follow_symlinks=False)
    return target
