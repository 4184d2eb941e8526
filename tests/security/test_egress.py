"""The agents' allow-listing proxy on its own (`ratchet.job.egress`), with real sockets.

What the study-level test (test_agent_egress.py) cannot easily show: how endpoints are
read from what the user configures, and that a plain-HTTP connection that was let through
cannot carry a second request to another server (keep-alive smuggling).
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ratchet.job.egress import AllowList, Endpoint, Proxy, endpoint
from ratchet.proposers.agent_clis import model_endpoints


def test_endpoints_are_read_from_urls_hosts_and_ports():
    assert endpoint("https://api.anthropic.com/v1") == Endpoint("api.anthropic.com", 443)
    assert endpoint("http://127.0.0.1:8080/v1") == Endpoint("127.0.0.1", 8080)
    assert endpoint("Example.COM.") == Endpoint("example.com", 443)
    assert endpoint("[::1]:9000") == Endpoint("::1", 9000)
    assert endpoint("host:notaport") is None and endpoint("") is None
    allow = AllowList([Endpoint("localhost", 8080), Endpoint("api.openai.com", 443)])
    assert allow.allows(Endpoint("127.0.0.1", 8080))  # one loopback host, by any name
    assert not allow.allows(Endpoint("127.0.0.1", 8265))  # Ray's dashboard: another port
    assert not allow.allows(Endpoint("api.openai.com", 80))


def test_the_model_endpoints_come_from_the_cli_the_env_and_codex_config(tmp_path: Path):
    (tmp_path / "config.toml").write_text(
        '[model_providers.mine]\nbase_url = "http://10.0.0.5:4000/v1"\n')
    found = model_endpoints("/opt/bin/codex", {
        "OPENAI_BASE_URL": "https://llm.internal:8443/v1", "HTTPS_PROXY": "http://proxy:3128",
        "NO_PROXY": "localhost", "CODEX_HOME": str(tmp_path), "LANG": "C.UTF-8"})
    assert {endpoint(f) for f in found} == {
        Endpoint("api.openai.com", 443), Endpoint("chatgpt.com", 443),
        Endpoint("llm.internal", 8443), Endpoint("10.0.0.5", 4000)}  # never the proxy


class Recorder(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.paths: list[str] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as a client would hope for

            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                server.paths.append(self.path)
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


@contextmanager
def recorder() -> Iterator[Recorder]:
    server = Recorder()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_a_second_request_on_an_allowed_connection_reaches_no_other_server():
    with recorder() as model, recorder() as other, \
            Proxy(AllowList([Endpoint("127.0.0.1", model.server_address[1])])) as proxy:
        m, o = model.server_address[1], other.server_address[1]
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(str(proxy.socket_path))
            conn.settimeout(10)
            conn.sendall(f"GET http://127.0.0.1:{m}/first HTTP/1.1\r\nHost: 127.0.0.1:{m}\r\n\r\n"
                         f"GET http://127.0.0.1:{o}/second HTTP/1.1\r\nHost: 127.0.0.1:{o}\r\n"
                         "\r\n".encode())
            got = b""
            while got.count(b"HTTP/1.1 ") < 2:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                got += chunk
        with socket.socket(socket.AF_UNIX) as conn:  # and asked on its own: refused
            conn.connect(str(proxy.socket_path))
            conn.sendall(f"CONNECT 127.0.0.1:{o} HTTP/1.1\r\n\r\n".encode())
            assert conn.recv(100).startswith(b"HTTP/1.1 403")
    assert other.paths == []
    assert model.paths[0] == "/first"  # as a server expects it, not the proxy form
    assert proxy.refused == [f"127.0.0.1:{o}"]
