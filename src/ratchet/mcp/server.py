"""The MCP server: tools.py's seven tools with typed schemas and descriptions an agent
can act on, over stdio (what Claude Code, Codex and Cursor start) or streamable HTTP on
loopback behind a bearer token.

Built on the official SDK's MCPServer (mcp 2.x, the FastMCP of 1.x renamed): each tool's
JSON schema comes from its signature (pydantic), an argument of the wrong shape is
refused by the SDK before our code runs, and a ToolError is returned to the model as an
`isError` result with our one line, logged without a traceback. Every error of ours (a
UserError, a fault of this machine) is turned into one; anything else would be a bug.
"""

from __future__ import annotations

import functools
import hmac
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field, ValidationError

from ratchet import __version__
from ratchet.core.errors import UserError
from ratchet.driver import infra
from ratchet.mcp.tools import (
    MAX_DESCRIPTION,
    MAX_FILES,
    MAX_IDEA,
    MAX_IDS,
    MAX_WAIT_S,
    PROPOSER,
    StudyTools,
)
from ratchet.proposers.scratch import MAX_FILE_BYTES

F = TypeVar("F", bound=Callable[..., Any])

INSTRUCTIONS = """\
ratchet runs a research study on a repository you cannot see: it measures every change
you submit against the incumbent (the best kept version) with statistics behind every
verdict, keeps a change only when it is better beyond the noise, and reverts everything
else. Loop and never stop: call `study` once, then `files` to read the incumbent, write
new full contents of editable files, `submit` several candidates (they run side by side),
`wait` for their verdicts, read `history` so as not to repeat an experiment, and go on
from the new incumbent."""


def _as_tool_errors(fn: F) -> F:
    """A user error or a machine fault is one line to the model (isError), never a
    traceback; whatever else escapes is a bug and the SDK logs it as one."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except UserError as exc:
            raise ToolError(str(exc)) from None
        except (sqlite3.Error, OSError) as exc:
            fault = infra.as_fault(exc)
            if fault is None and not isinstance(exc, OSError):
                raise
            raise ToolError(str(fault or f"{exc} (a fault of the machine ratchet runs on, "
                                             "not of the submission: try again later)")
                            ) from None

    return call  # type: ignore[return-value]


def field_name(loc: tuple[int | str, ...]) -> str:
    """Pydantic's location of a bad argument as our errors name a field: files['a.py'],
    ids[0]."""
    name = str(loc[0]) if loc else "arguments"
    for part in loc[1:]:
        name += f"[{part}]" if isinstance(part, int) else f"[{str(part)[:80]!r}]"
    return name


class StudyServer(MCPServer):
    """The SDK's server, with arguments of the wrong shape said as our own errors are: one
    line per field, naming it (the SDK's text is pydantic's report: several lines, a link,
    the rejected value)."""

    async def call_tool(self, name: str, arguments: dict[str, Any],
                        context: Any = None) -> Any:
        try:
            return await super().call_tool(name, arguments, context)
        except ToolError as exc:
            cause = exc.__cause__
            if not isinstance(cause, ValidationError):
                raise
            said = "; ".join(f"{field_name(tuple(error['loc']))}: {error['msg']}"
                             for error in cause.errors()[:5])
            raise ToolError(f"Error executing tool {name}: {said} (see the tool's input "
                            "schema)") from cause


def build(repo: Path) -> MCPServer:
    """The server for the study in `repo`."""
    tools = StudyTools(repo)
    server: MCPServer = StudyServer(name="ratchet", title="ratchet study", version=__version__,
                                  instructions=INSTRUCTIONS, log_level="WARNING")
    reading = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    @server.tool(annotations=reading)
    @_as_tool_errors
    def study() -> dict[str, Any]:
        """The study: its metric and goal (lower or higher is better), the editable files'
        globs and the protected ones, the incumbent (the best kept version) with its
        estimate and 95% interval, the measured noise and the false-keep rate, how many
        candidates run side by side (`parallel`), the budget left, pending ideas, the
        hardware, and the paths `files` can read. Call it first."""
        return tools.study()

    @server.tool(annotations=reading)
    @_as_tool_errors
    def files(
        paths: Annotated[list[str], Field(
            description="repository-relative paths to read, e.g. [\"solution.py\"]; an "
            "empty list reads every editable file", max_length=MAX_FILES)] = [],  # noqa: B006
    ) -> dict[str, Any]:
        """Read the incumbent's files: the editable ones, and the context files the study
        gives (model and hardware docs, program.md); `study` lists them under `readable`.
        An editable path that does not exist yet reads as null. The evaluator and other
        protected files are never shown."""
        return tools.files(paths)

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=False,
                                             open_world_hint=False))
    @_as_tool_errors
    def submit(
        files: Annotated[dict[str, str | None], Field(
            description="the files you changed: {path: its complete new content as text}, "
            "or null to delete a file; only editable paths (see `study`), at most "
            f"{MAX_FILES} files of at most {MAX_FILE_BYTES >> 20} MiB each")],
        description: Annotated[str, Field(
            description="one line: what this candidate changes and why you expect it to help",
            min_length=1, max_length=MAX_DESCRIPTION)],
        base: Annotated[str | None, Field(
            description="build on this candidate's version (an id from `history`, e.g. "
            "c0004) instead of the incumbent; leave it out to build on the incumbent")] = None,
    ) -> dict[str, Any]:
        """Submit one candidate: new contents of editable files on the incumbent (or on
        the candidate `base`). It is checked like any proposer's edit (editable globs,
        protected files and ratchet.toml, no .git, no module shadowing, forbid rules, no
        repeat) and, if it passes, starts running at once; the result holds its id. Submit
        several before waiting: they run side by side. A bad submission is an error naming
        the field and is not recorded; a study over its budget takes none."""
        return tools.submit(files, description, base)

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True,
                                             open_world_hint=False))
    @_as_tool_errors
    def wait(
        ids: Annotated[list[str], Field(
            description="candidate ids from `submit`", min_length=1, max_length=MAX_IDS)],
        timeout: Annotated[float, Field(
            description="seconds to wait for them to finish; if some still run then, the "
            "result says `done: false` and you call wait again", ge=0, le=MAX_WAIT_S)] = 50.0,
    ) -> dict[str, Any]:
        """Wait for candidates and judge them as `ratchet wait` does (the baseline first, a
        would-be keep confirmed on fresh paired measurements, the hold-out): each verdict
        has `status` (keep, discard, crash, rejected, ...), `code`, plain-word `reasons`,
        the metric, `gain` and `margin`. A keep becomes the new incumbent; build on it."""
        return tools.wait(ids, timeout)

    @server.tool(annotations=reading)
    @_as_tool_errors
    def history(
        n: Annotated[int, Field(description="how many of the latest candidates", ge=1,
                                le=500)] = 20,
    ) -> dict[str, Any]:
        """What was tried, oldest first: each candidate's id, status, metric, gain, reasons
        and description, who proposed it, and the incumbent now. Read it before proposing
        so as not to repeat a discarded experiment."""
        return tools.history(n)

    @server.tool(annotations=reading)
    @_as_tool_errors
    def show(
        id: Annotated[str, Field(  # noqa: A002 - the tool's parameter, as the agent sees it
            description="a candidate id (c0003), job id or commit", min_length=1,
            max_length=80)],
    ) -> dict[str, Any]:
        """One candidate's audit trail, as `ratchet show` gives it: its verdict and
        reasons, the measurements and phases, what it cost, and its diff."""
        return tools.show(id)

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, idempotent_hint=True,
                                             open_world_hint=False))
    @_as_tool_errors
    def idea(
        text: Annotated[str, Field(description="the idea, in a sentence or two",
                                   min_length=1, max_length=MAX_IDEA)],
    ) -> dict[str, Any]:
        """Queue an idea for the study's proposers (a `ratchet run` beside you takes
        pending ideas first, one a candidate)."""
        return tools.idea(text)

    return server


def serve_stdio(repo: Path) -> None:
    build(repo).run("stdio")


def serve_http(repo: Path, port: int, token: str, log: Callable[[str], None]) -> None:
    """Streamable HTTP on 127.0.0.1:PORT/mcp; every request needs `Authorization: Bearer
    TOKEN` (anything else on this machine could otherwise drive the study)."""
    import anyio
    import uvicorn
    from starlette.responses import PlainTextResponse
    from starlette.types import ASGIApp, Receive, Scope, Send

    app = build(repo).streamable_http_app(host="127.0.0.1")
    expected = f"Bearer {token}".encode()

    def guarded(inner: ASGIApp) -> ASGIApp:
        async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http":
                given = dict(scope.get("headers") or []).get(b"authorization", b"")
                if not hmac.compare_digest(given, expected):
                    await PlainTextResponse("a bearer token is needed (ratchet mcp --http "
                                            "printed it)", status_code=401)(scope, receive, send)
                    return
            await inner(scope, receive, send)

        return asgi

    config = uvicorn.Config(guarded(app), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    log(f"ratchet mcp: http://127.0.0.1:{port}/mcp (header Authorization: Bearer {token}); "
        f"proposer {PROPOSER}")
    anyio.run(server.serve)
