"""`ratchet mcp --print-config CLIENT`: how each agent CLI is told to start the server.

The command is this interpreter's own `-m ratchet.cli mcp -C REPO` (absolute paths), so
the agent's client finds the same ratchet whatever its PATH and working directory; the
agent itself may then run anywhere, a throwaway directory included.
"""

from __future__ import annotations

import json
import shlex
import sys
from enum import StrEnum
from pathlib import Path

SERVER_NAME = "ratchet"
# Codex gives a tool 60 s by default; `wait` may take up to tools.MAX_WAIT_S
CODEX_TOOL_TIMEOUT_S = 660
# and a server 10 s to start: a loaded machine takes longer to import Python and git
CODEX_STARTUP_TIMEOUT_S = 60


class Client(StrEnum):
    CLAUDE = "claude"
    CODEX = "codex"
    CURSOR = "cursor"


def server_command(repo: Path) -> list[str]:
    return [sys.executable, "-m", "ratchet.cli", "mcp", "-C", str(repo.resolve())]


def config_text(client: Client, repo: Path) -> str:
    """The line (or short block) that registers the server with CLIENT."""
    command, *args = server_command(repo)
    if client == Client.CLAUDE:  # a shell command: `claude mcp add NAME -- CMD ARGS`
        return shlex.join(["claude", "mcp", "add", SERVER_NAME, "--", command, *args])
    if client == Client.CODEX:  # a table of ~/.codex/config.toml
        return "\n".join([
            f"[mcp_servers.{SERVER_NAME}]",
            f"command = {json.dumps(command)}",
            f"args = {json.dumps(args)}",
            f"tool_timeout_sec = {CODEX_TOOL_TIMEOUT_S}",
            f"startup_timeout_sec = {CODEX_STARTUP_TIMEOUT_S}",
        ])
    # Cursor: .cursor/mcp.json (the project's) or ~/.cursor/mcp.json
    return json.dumps({"mcpServers": {SERVER_NAME: {"command": command, "args": args}}},
                      indent=2)


def where(client: Client) -> str:
    """Where CLIENT's text goes, said on stderr beside it."""
    return {Client.CLAUDE: "run this command (add --scope user for every project)",
            Client.CODEX: "add this to ~/.codex/config.toml",
            Client.CURSOR: "put this in .cursor/mcp.json (or ~/.cursor/mcp.json)"}[client]
