"""A scripted model on loopback for the real coding-agent CLIs: real HTTP, each CLI's own API.

- `POST /v1/messages`: Anthropic Messages, streamed (server-sent events) or not, with
  tool use (Claude Code),
- `POST /v1/responses`: the OpenAI Responses API, streamed, with function calls (Codex),
- `POST /v1/chat/completions`: OpenAI Chat Completions, streamed or not (aider).

A *script* decides each reply of the agent's main conversation (the requests that offer
tools, or for aider every request) from the request itself: `script(turn) -> Step`, where
`Step` is `Say(text)` (a final answer) or `Call(name, arguments)` (a tool call in the CLI's
own tool set). Side requests a CLI makes on its own (Claude Code's title or quota calls,
which offer no tools) get a short text answer. Every request is recorded.

    with AgentServer(script) as server:
        env["ANTHROPIC_BASE_URL"] = server.url
"""

from __future__ import annotations

import json
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from llm_server import QuietHTTPServer


@dataclass(frozen=True)
class Say:
    text: str


@dataclass(frozen=True)
class Call:
    name: str
    arguments: dict[str, Any]
    namespace: str | None = None  # a tool offered inside a Responses `namespace` (Codex's MCP)


Step = Say | Call


@dataclass
class Turn:
    """One request of the agent's conversation, as the script sees it."""

    path: str
    body: dict[str, Any]
    at: float = field(default_factory=time.time)

    @property
    def api(self) -> str:
        for suffix, api in (("/messages", "anthropic"), ("/responses", "responses"),
                            ("/chat/completions", "chat")):
            if self.path.split("?")[0].endswith(suffix):
                return api
        return "unknown"

    @property
    def offers_tools(self) -> bool:
        return bool(self.body.get("tools"))

    @property
    def tool_results(self) -> list[str]:
        """The outputs of the tool calls made so far, oldest first, as text."""
        out: list[str] = []
        if self.api == "responses":
            for item in self.body.get("input") or []:
                if isinstance(item, dict) and item.get("type") == "function_call_output":
                    output = item.get("output")
                    out.append(output if isinstance(output, str) else json.dumps(output))
            return out
        for message in self.body.get("messages") or []:
            content = message.get("content")
            if message.get("role") == "tool":  # chat completions
                out.append(_text(content))
            elif isinstance(content, list):
                out.extend(_text(block.get("content")) for block in content
                           if isinstance(block, dict) and block.get("type") == "tool_result")
        return out

    @property
    def messages_text(self) -> str:
        """The messages' text as the model reads it (Chat Completions and Messages)."""
        return "\n".join(_text(m.get("content")) for m in self.body.get("messages") or [])

    @property
    def text(self) -> str:
        """Every piece of text in the request (system, instructions, messages), for matching."""
        return json.dumps(self.body)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(_text(c.get("text", c.get("content", ""))) if isinstance(c, dict)
                       else str(c) for c in content)
    return "" if content is None else str(content)


Script = Callable[[Turn], Step]


class AgentServer:
    def __init__(self, script: Script, side_reply: str = "ok",
                 tls: tuple[Path, Path] | None = None) -> None:
        """`tls`: (certificate chain, key) to serve HTTPS, as behind a re-signing proxy."""
        self.script = script
        self.tls = tls
        self.side_reply = side_reply
        self.turns: list[Turn] = []
        self.unknown: list[str] = []  # paths no handler speaks, for a test's failure message
        self._lock = threading.Lock()
        self._ids = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                # model listings and the like: an empty list, not an error page
                server.unknown.append(f"GET {self.path}")
                self._json(200, {"object": "list", "data": [], "models": []})

            def do_HEAD(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {}
                turn = Turn(self.path, body)
                with server._lock:
                    server.turns.append(turn)
                if turn.api == "unknown":
                    server.unknown.append(f"POST {self.path}")
                    if self.path.endswith("/count_tokens"):
                        self._json(200, {"input_tokens": 100})
                    else:
                        self._json(404, {"error": {"message": f"no such path {self.path}"}})
                    return
                try:
                    step = server._step(turn)
                    events = server._reply(turn, step)
                except Exception as exc:  # a broken script: say so to the CLI, loudly
                    server.unknown.append(f"script failed on {self.path}: {exc!r}")
                    self._json(500, {"error": {"type": "api_error", "message": repr(exc)}})
                    return
                try:
                    if body.get("stream"):
                        self._sse(events)
                    else:
                        self._json(200, server._whole(turn, step))
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def _json(self, status: int, payload: dict) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _sse(self, events: Iterator[tuple[str | None, dict | str]]) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("cache-control", "no-cache")
                self.send_header("connection", "close")
                self.end_headers()
                for name, data in events:
                    chunk = (f"event: {name}\n" if name else "") + "data: " + (
                        data if isinstance(data, str) else json.dumps(data)) + "\n\n"
                    self.wfile.write(chunk.encode())
                    self.wfile.flush()
                self.close_connection = True

        self.httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        if tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(str(tls[0]), str(tls[1]))
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def main_turns(self) -> list[Turn]:
        return [t for t in self.turns if self._is_main(t)]

    def _is_main(self, turn: Turn) -> bool:
        return turn.api == "chat" or turn.offers_tools

    def _next_id(self, prefix: str) -> str:
        with self._lock:
            self._ids += 1
            return f"{prefix}{self._ids:04d}"

    def _step(self, turn: Turn) -> Step:
        return self.script(turn) if self._is_main(turn) else Say(self.side_reply)

    # -- replies, per API ------------------------------------------------------------------

    def _reply(self, turn: Turn, step: Step) -> Iterator[tuple[str | None, dict | str]]:
        if turn.api == "anthropic":
            return iter(list(self._anthropic_events(turn, step)))
        if turn.api == "responses":
            return iter(list(self._responses_events(turn, step)))
        return iter(list(self._chat_events(turn, step)))

    def _whole(self, turn: Turn, step: Step) -> dict:
        model = turn.body.get("model", "model")
        if turn.api == "anthropic":
            block: dict[str, Any] = (
                {"type": "text", "text": step.text} if isinstance(step, Say) else
                {"type": "tool_use", "id": self._next_id("toolu_"), "name": step.name,
                 "input": step.arguments})
            return {"id": self._next_id("msg_"), "type": "message", "role": "assistant",
                    "model": model, "content": [block],
                    "stop_reason": "end_turn" if isinstance(step, Say) else "tool_use",
                    "stop_sequence": None, "usage": {"input_tokens": 100, "output_tokens": 50}}
        if turn.api == "chat":
            message: dict[str, Any] = {"role": "assistant"}
            if isinstance(step, Say):
                message["content"] = step.text
            else:
                message["content"] = None
                message["tool_calls"] = [{"id": self._next_id("call_"), "type": "function",
                                          "function": {"name": step.name,
                                                       "arguments": json.dumps(step.arguments)}}]
            return {"id": self._next_id("chatcmpl-"), "object": "chat.completion",
                    "created": int(time.time()), "model": model,
                    "choices": [{"index": 0, "message": message,
                                 "finish_reason": "stop" if isinstance(step, Say)
                                 else "tool_calls"}],
                    "usage": {"prompt_tokens": 100, "completion_tokens": 50,
                              "total_tokens": 150}}
        return self._response_object(turn, [self._response_item(step)], "completed")

    def _anthropic_events(self, turn: Turn, step: Step) -> Iterator[tuple[str, dict]]:
        model = turn.body.get("model", "model")
        yield "message_start", {"type": "message_start", "message": {
            "id": self._next_id("msg_"), "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": 100, "output_tokens": 1}}}
        if isinstance(step, Say):
            yield "content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "text", "text": ""}}
            for piece in _pieces(step.text):
                yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "text_delta", "text": piece}}
            stop = "end_turn"
        else:
            yield "content_block_start", {"type": "content_block_start", "index": 0,
                                          "content_block": {"type": "tool_use",
                                                            "id": self._next_id("toolu_"),
                                                            "name": step.name, "input": {}}}
            for piece in _pieces(json.dumps(step.arguments)):
                yield "content_block_delta", {"type": "content_block_delta", "index": 0,
                                              "delta": {"type": "input_json_delta",
                                                        "partial_json": piece}}
            stop = "tool_use"
        yield "content_block_stop", {"type": "content_block_stop", "index": 0}
        yield "message_delta", {"type": "message_delta",
                                "delta": {"stop_reason": stop, "stop_sequence": None},
                                "usage": {"output_tokens": 50}}
        yield "message_stop", {"type": "message_stop"}

    def _response_item(self, step: Step) -> dict[str, Any]:
        if isinstance(step, Say):
            return {"type": "message", "id": self._next_id("msg_"), "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": step.text, "annotations": []}]}
        item = {"type": "function_call", "id": self._next_id("fc_"), "status": "completed",
                "call_id": self._next_id("call_"), "name": step.name,
                "arguments": json.dumps(step.arguments)}
        return {**item, "namespace": step.namespace} if step.namespace else item

    def _response_object(self, turn: Turn, output: list[dict], status: str) -> dict[str, Any]:
        return {"id": self._next_id("resp_"), "object": "response", "created_at": int(time.time()),
                "status": status, "model": turn.body.get("model", "model"), "output": output,
                "usage": {"input_tokens": 100, "input_tokens_details": {"cached_tokens": 0},
                          "output_tokens": 50, "output_tokens_details": {"reasoning_tokens": 0},
                          "total_tokens": 150}}

    def _responses_events(self, turn: Turn, step: Step) -> Iterator[tuple[str, dict]]:
        item = self._response_item(step)
        created = self._response_object(turn, [], "in_progress")
        yield "response.created", {"type": "response.created", "response": created}
        if isinstance(step, Say):
            added = {**item, "status": "in_progress", "content": []}
            yield "response.output_item.added", {"type": "response.output_item.added",
                                                 "output_index": 0, "item": added}
            for piece in _pieces(step.text):
                yield "response.output_text.delta", {"type": "response.output_text.delta",
                                                     "item_id": item["id"], "output_index": 0,
                                                     "content_index": 0, "delta": piece}
        else:
            yield "response.output_item.added", {"type": "response.output_item.added",
                                                 "output_index": 0,
                                                 "item": {**item, "arguments": ""}}
        yield "response.output_item.done", {"type": "response.output_item.done",
                                            "output_index": 0, "item": item}
        done = {**created, "status": "completed", "output": [item]}
        yield "response.completed", {"type": "response.completed", "response": done}

    def _chat_events(self, turn: Turn, step: Step) -> Iterator[tuple[None, dict | str]]:
        model = turn.body.get("model", "model")
        cid = self._next_id("chatcmpl-")

        def chunk(delta: dict, finish: str | None = None, usage: bool = False) -> dict:
            out: dict[str, Any] = {"id": cid, "object": "chat.completion.chunk",
                                   "created": int(time.time()), "model": model,
                                   "choices": [{"index": 0, "delta": delta,
                                                "finish_reason": finish}]}
            if usage:
                out["usage"] = {"prompt_tokens": 100, "completion_tokens": 50,
                                "total_tokens": 150}
            return out

        yield None, chunk({"role": "assistant", "content": ""})
        if isinstance(step, Say):
            for piece in _pieces(step.text):
                yield None, chunk({"content": piece})
            yield None, chunk({}, "stop", usage=True)
        else:
            yield None, chunk({"tool_calls": [{"index": 0, "id": self._next_id("call_"),
                                               "type": "function",
                                               "function": {"name": step.name,
                                                            "arguments": json.dumps(
                                                                step.arguments)}}]})
            yield None, chunk({}, "tool_calls", usage=True)
        yield None, "[DONE]"

    # -- lifetime --------------------------------------------------------------------------

    def start(self) -> AgentServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> AgentServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _pieces(text: str, size: int = 40) -> list[str]:
    """A reply in several deltas, as a real stream arrives."""
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


class ConnectProxy:
    """An HTTP proxy on loopback that tunnels CONNECT to loopback addresses only, as a
    corporate proxy would for HTTPS; it records each tunnel's target (`host:port`)."""

    def __init__(self) -> None:
        self.tunnels: list[str] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_CONNECT(self) -> None:  # noqa: N802 (http.server's naming)
                host, _, port = self.path.rpartition(":")
                if host not in ("127.0.0.1", "localhost") or not port.isdigit():
                    self.send_error(403, "this test proxy reaches loopback only")
                    return
                try:
                    upstream = socket.create_connection(("127.0.0.1", int(port)), timeout=30)
                except OSError:
                    self.send_error(502)
                    return
                proxy.tunnels.append(self.path)
                self.send_response(200, "Connection established")
                self.end_headers()
                self.close_connection = True
                _pipe(self.connection, upstream)

        self.httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ConnectProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    """Copy bytes both ways until either side closes (bounded by the sockets' timeouts)."""
    sockets = [a, b]
    try:
        while True:
            readable, _, _ = select.select(sockets, [], [], 30)
            if not readable:
                return
            for sock in readable:
                data = sock.recv(65536)
                if not data:
                    return
                (b if sock is a else a).sendall(data)
    except OSError:
        return
    finally:
        b.close()
