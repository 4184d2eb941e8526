"""A real HTTP server on loopback speaking the LLM providers' protocols, for tests.

`POST /v1/chat/completions` (OpenAI) and `POST /v1/messages` (Anthropic) answer from a
script: a queue of `Answer`s, consumed in arrival order, or a function of the request.
An answer can be a text reply (with token counts), an HTTP error (429 with retry-after,
500), or a reply delayed past the client's timeout. Every request is recorded.

    with LLMServer() as server:
        server.script(Answer("DESCRIPTION: ..."), Answer(status=429, retry_after=0.1))
        client = openai.OpenAI(base_url=server.openai_url, api_key="dummy")
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Answer:
    text: str = ""
    status: int = 200
    delay: float = 0.0  # seconds before answering (past the client timeout: a timeout)
    retry_after: float | None = None
    input_tokens: int = 100
    output_tokens: int = 50
    body: dict | None = None  # a raw JSON body instead of the protocol's reply
    raw: bytes | None = None  # these exact bytes as the body (invalid JSON, a huge reply)
    drip: float = 0.0  # seconds between single bytes of the body (a slow-drip reply)


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float = field(default_factory=time.time)

    @property
    def protocol(self) -> str:
        return "anthropic" if self.path.endswith("/messages") else "openai"

    @property
    def prompt(self) -> str:
        """All message text of the request, system included, for assertions."""
        parts = []
        if isinstance(self.body.get("system"), str):
            parts.append(self.body["system"])
        for message in self.body.get("messages", []):
            content = message.get("content")
            if isinstance(content, list):
                content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
            parts.append(str(content))
        return "\n".join(parts)

    @property
    def last_user(self) -> str:
        users = [m for m in self.body.get("messages", []) if m.get("role") == "user"]
        content = users[-1]["content"] if users else ""
        if isinstance(content, list):
            content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
        return content


class QuietHTTPServer(ThreadingHTTPServer):
    """A client that hangs up (ratchet cutting off a reply it will not read whole) is
    normal here: not a traceback on the test process's stderr, where an in-process
    `ratchet` call would print it as its own."""

    def handle_error(self, request, client_address) -> None:  # noqa: ANN001
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class LLMServer:
    def __init__(self) -> None:
        self.requests: list[Request] = []
        self._queue: list[Answer] = []
        self._responder: Callable[[Request], Answer] | None = None
        self._lock = threading.Lock()
        self.default = Answer(status=500, body={"error": {"message": "script exhausted"}})
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b"{}"
                try:
                    body = json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    body = {}
                request = Request(self.path, {k.lower(): v for k, v in self.headers.items()},
                                  body)
                answer = server._next(request)
                if answer.delay:
                    time.sleep(answer.delay)
                payload, status = server._payload(request, answer)
                data = answer.raw if answer.raw is not None else json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    if answer.retry_after is not None:
                        self.send_header("retry-after", f"{answer.retry_after:g}")
                    self.end_headers()
                    if not answer.drip:
                        self.wfile.write(data)
                    for i in range(len(data) if answer.drip else 0):
                        self.wfile.write(data[i:i + 1])
                        self.wfile.flush()
                        time.sleep(answer.drip)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timed out) before we answered

        self.httpd = QuietHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.port = self.httpd.server_address[1]
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    # -- addresses ------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_url(self) -> str:
        return self.url + "/v1"  # the OpenAI SDK appends /chat/completions

    @property
    def anthropic_url(self) -> str:
        return self.url  # the Anthropic SDK appends /v1/messages

    # -- scripting ------------------------------------------------------------------------

    def script(self, *answers: Answer | str) -> None:
        with self._lock:
            self._queue.extend(a if isinstance(a, Answer) else Answer(a) for a in answers)

    def respond_with(self, responder: Callable[[Request], Answer | str]) -> None:
        def wrapped(request: Request) -> Answer:
            answer = responder(request)
            return answer if isinstance(answer, Answer) else Answer(answer)

        self._responder = wrapped

    def _next(self, request: Request) -> Answer:
        with self._lock:
            self.requests.append(request)
            if self._queue:
                return self._queue.pop(0)
        if self._responder is not None:
            return self._responder(request)
        return self.default

    def _payload(self, request: Request, answer: Answer) -> tuple[dict, int]:
        if answer.body is not None:
            return answer.body, answer.status
        if answer.status != 200:
            if request.protocol == "anthropic":
                kind = "rate_limit_error" if answer.status == 429 else "api_error"
                return {"type": "error", "error": {"type": kind, "message": f"scripted "
                        f"{answer.status}"}}, answer.status
            return {"error": {"message": f"scripted {answer.status}", "type": "server_error",
                              "code": None}}, answer.status
        model = request.body.get("model", "model")
        if request.protocol == "anthropic":
            return {
                "id": f"msg_{len(self.requests)}",
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [{"type": "text", "text": answer.text}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": answer.input_tokens,
                          "output_tokens": answer.output_tokens},
            }, 200
        return {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": answer.text}}],
            "usage": {"prompt_tokens": answer.input_tokens,
                      "completion_tokens": answer.output_tokens,
                      "total_tokens": answer.input_tokens + answer.output_tokens},
        }, 200

    # -- lifetime -------------------------------------------------------------------------

    def start(self) -> LLMServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> LLMServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
