"""The agents' allow-listing proxy on its own (`ratchet.job.egress`), with real sockets.

What the study-level test (test_agent_egress.py) cannot easily show: how endpoints are
read from what the user configures, and that a plain-HTTP connection that was let through
cannot carry a second request to another server (keep-alive smuggling).
"""

from __future__ import annotations

import http.server
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import ROOT

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


# A process that ran an agent's proxy, closed it, then listens on loopback itself (the
# driver asking its model's server, a test's stand-in server): the proxy's listening
# descriptor number is the new listener's now. The process is stopped and continued
# meanwhile, as a debugger or a shell's job control may; then a client connects.
AFTER_CLOSE = """
import os, socket, sys
from ratchet.job.egress import AllowList, Proxy

def sockets():
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                found.add(int(fd))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return found

before = sockets()
proxy = Proxy(AllowList([]))
(number,) = sockets() - before
proxy.close()
server = socket.socket()
server.bind(("127.0.0.1", 0))
server.listen()
if server.fileno() != number:
    os.dup2(server.fileno(), number)
print("listening", flush=True)
sys.stdin.readline()  # stopped and continued meanwhile
client = socket.create_connection(server.getsockname(), timeout=5)
client.sendall(b"GET / HTTP/1.1\\r\\nHost: 127.0.0.1\\r\\n\\r\\n")
client.settimeout(0.5)
try:
    print(client.recv(200).decode().splitlines()[0])
except TimeoutError:
    server.settimeout(5)
    server.accept()
    print("reached its own server")
"""


def test_a_closed_proxy_takes_no_connection_meant_for_the_next_listener():
    """Seen as a flake: a study's loopback LLM server "answered" 403, the proxy's refusal
    (an accept() left waiting on the closed proxy's descriptor took the connection)."""
    child = subprocess.Popen([sys.executable, "-c", AFTER_CLOSE], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert child.stdout is not None and child.stdout.readline() == "listening\n"
    os.kill(child.pid, signal.SIGSTOP)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _state(child.pid) not in ("T", "t"):
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGCONT)
    out, _ = child.communicate("go\n", timeout=30)
    assert out == "reached its own server\n", out


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]
