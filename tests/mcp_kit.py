"""Driving `ratchet mcp` with the official SDK's own client: in this process (the server
object) or over a real stdio subprocess of `python -m ratchet.cli mcp`, as an agent's
client starts it."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO, TypeVar

import anyio
import pytest
from helpers import RATCHET, ROOT

pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install -e '.[mcp]')")

from mcp import Client, StdioServerParameters  # noqa: E402
from mcp.client.stdio import stdio_client  # noqa: E402

T = TypeVar("T")
TOOLS = {"study", "files", "submit", "wait", "history", "show", "idea"}


def in_process(repo: Path, body: Callable[[Client], Awaitable[T]]) -> T:
    """`await body(client)` with a client connected to the server of REPO in-process."""
    from ratchet.mcp.server import build

    async def main() -> T:
        async with Client(build(repo)) as client:
            return await body(client)

    return anyio.run(main)


def stdio_server(repo: Path, cwd: Path | None = None) -> StdioServerParameters:
    """A real `python -m ratchet.cli mcp -C REPO` subprocess, started in CWD, as Claude
    Code or Codex starts it (connect with `Client(stdio_client(params, errlog=...))`)."""
    return StdioServerParameters(
        command=RATCHET[0], args=[*RATCHET[1:], "mcp", "-C", str(repo)],
        env={"PYTHONPATH": str(ROOT / "src")},
        cwd=str(cwd) if cwd else None)


def over_stdio(repo: Path, body: Callable[[Client], Awaitable[T]], errlog: TextIO,
               cwd: Path | None = None) -> T:
    """The same over a real stdio server process (its stderr to ERRLOG)."""
    params = stdio_server(repo, cwd)

    async def main() -> T:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            return await body(client)

    return anyio.run(main)


async def call(client: Client, tool: str, **args: Any) -> Any:
    """A tool's result as JSON; a tool error fails the test with its text."""
    result = await client.call_tool(tool, args)
    text = result.content[0].text  # type: ignore[union-attr]
    assert not result.is_error, f"{tool}({args}) failed: {text}"
    return json.loads(text)


async def refused(client: Client, tool: str, **args: Any) -> str:
    """The error text of a call that must be refused."""
    result = await client.call_tool(tool, args)
    text = result.content[0].text  # type: ignore[union-attr]
    assert result.is_error, f"{tool} accepted {str(args)[:200]}: {text[:300]}"
    return text


def edited(repo: Path, *changes: str, path: str = "solution.py") -> dict[str, str]:
    """`submit`'s files: PATH of the committed task with each OLD replaced by its NEW
    (`changes`: old, new, old, new, ...)."""
    source = (repo / path).read_text()
    for old, new in zip(changes[::2], changes[1::2], strict=True):
        assert old in source, old
        source = source.replace(old, new)
    return {path: source}


class RawClient:
    """A hostile client that writes the stdio protocol's lines by hand (what the SDK's own
    client would never send: JSON escapes of no Unicode text, lines of no JSON at all)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.buffer = b""

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()

    def request(self, id: int, method: str, params: dict) -> None:  # noqa: A002
        self.send(json.dumps({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))

    def answer(self, id: int, timeout: float = 60) -> dict:  # noqa: A002
        """The server's reply to request ID (other lines skipped), or a failed test."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while True:
            while b"\n" in self.buffer:
                line, self.buffer = self.buffer.split(b"\n", 1)
                message = json.loads(line)
                if message.get("id") == id:
                    return message
            left = deadline - time.monotonic()
            assert left > 0, f"no answer to request {id} in {timeout} s"
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 1 << 16)
                assert chunk, f"the server closed its output before answering {id}"
                self.buffer += chunk


@contextmanager
def raw_stdio(repo: Path, errlog: TextIO) -> Iterator[RawClient]:
    """A real `ratchet mcp` process, initialised by hand, for a RawClient."""
    params = stdio_server(repo)
    proc = subprocess.Popen([params.command, *params.args], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=errlog,
                            env={**os.environ, **(params.env or {})})
    client = RawClient(proc)
    try:
        client.request(0, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                         "clientInfo": {"name": "raw", "version": "0"}})
        assert "result" in client.answer(0), "the server did not initialise"
        client.send(json.dumps({"jsonrpc": "2.0", "method": "notifications/initialized"}))
        yield client
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
