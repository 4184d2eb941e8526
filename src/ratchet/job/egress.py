"""An allow-listing proxy: the one way out of an agent's network namespace.

A coding agent needs its model's API and nothing else. It runs with `Policy(network=False)`
(a network namespace with only loopback, like a candidate) and `Policy.proxy` naming this
proxy's Unix socket. Inside the namespace the sandbox's warden listens on
127.0.0.1:`PORT` and relays each connection to the socket (`warden.py --bridge`); the
agent's environment points `HTTPS_PROXY`/`HTTP_PROXY` there. Outside, this proxy reads
the first request of each connection and lets it through only to an allowed `host:port`:

- `CONNECT host:port` (HTTPS, and any tunnel a client asks for): a tunnel, bytes both ways;
- `GET http://host:port/...` (plain HTTP through a proxy): the request, to that server
  alone (what follows on the connection goes to the same server, whatever it names).

Anything else (another host, another port of an allowed host, a request it cannot parse)
gets `403` with one line saying so, and is recorded in `refused`. Where the user's own
setup goes through a proxy (the `HTTPS_PROXY` named in `[agent] env`), allowed tunnels go
through it (`upstream`), so a TLS-re-signing corporate proxy keeps working.

Why not Anthropic's sandbox-runtime (`srt`), which does the same with bubblewrap, socat
and a Node proxy: it needs Node >= 22.12 and socat on the machine, and bubblewrap always;
ratchet's PID-namespace level has no bubblewrap, and its warden already owns the party's
namespace. The bridge is the warden's, the filter is this module (stdlib only).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

# where the warden listens inside the party's own network namespace (nothing else is there)
PORT = 3128
PROXY_URL = f"http://127.0.0.1:{PORT}"
PROXY_ENV = ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy", "ALL_PROXY",
             "all_proxy")
HEAD_LIMIT = 64 * 1024  # a request line and headers; a proxy request never needs more
CONNECT_TIMEOUT_S = 15.0
CLOSE_WAIT_S = 5.0  # for the accepting thread to return once its listener is shut down


@dataclass(frozen=True, order=True)
class Endpoint:
    host: str  # lower case; an IPv6 address without brackets
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def endpoint(text: str, default_port: int = 443) -> Endpoint | None:
    """`host`, `host:port`, `[v6]:port` or a URL (`https://host/v1`: its scheme's port)."""
    text = text.strip()
    if not text:
        return None
    if "://" not in text:
        text = f"//{text}"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    if not parts.hostname:
        return None
    if port is None:
        port = {"http": 80, "https": 443}.get(parts.scheme, default_port)
    return Endpoint(parts.hostname.lower().rstrip("."), port)


class AllowList:
    """The endpoints a party may reach, by name and port exactly. `localhost` and
    127.0.0.1 are one host (a client may write either for a loopback model)."""

    LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})

    def __init__(self, endpoints: Iterable[Endpoint]) -> None:
        self.endpoints = frozenset(endpoints)

    def allows(self, target: Endpoint) -> bool:
        if target in self.endpoints:
            return True
        if target.host in self.LOOPBACK:
            return any(e.port == target.port and e.host in self.LOOPBACK for e in self.endpoints)
        return False

    def __str__(self) -> str:
        return ", ".join(str(e) for e in sorted(self.endpoints)) or "nothing"


class Proxy:
    """The proxy on a Unix socket (`socket_path`, in a directory of its own), serving until
    `close()`. Threads only: one accepting, two per open connection."""

    def __init__(self, allow: AllowList, upstream: Endpoint | None = None) -> None:
        self.allow = allow
        self.upstream = upstream
        self.refused: list[str] = []  # "host:port" asked for and refused, in order
        self.passed: list[str] = []
        self._dir = Path(tempfile.mkdtemp(prefix="ratchet-egress-"))
        # the party's uid must reach the socket: the directory is searchable, the socket
        # connectable by all (only the party's sandbox binds this directory in)
        os.chmod(self._dir, 0o755)
        self.socket_path = self._dir / "proxy.sock"
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(str(self.socket_path))
        os.chmod(self.socket_path, 0o666)
        self._server.listen(64)
        self._closed = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._acceptor = threading.Thread(target=self._accept, daemon=True, name="egress-proxy")
        self._acceptor.start()

    @property
    def directory(self) -> Path:
        return self._dir

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._server.accept()
            except OSError:
                return
            try:
                self._track(conn)
            except OSError:
                return  # closed meanwhile
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _track(self, sock: socket.socket) -> None:
        """Note an open socket, for `close()` to end; once closed, end it here instead."""
        with self._lock:
            if not self._closed.is_set():
                self._open.add(sock)
                return
        _end(sock)
        raise OSError("the proxy is closed")

    def _serve(self, conn: socket.socket) -> None:
        out: socket.socket | None = None
        try:
            head, rest = _read_head(conn)
            method, target = _request_target(head)
            if target is None or not self.allow.allows(target):
                asked = str(target) if target else head.split(b"\r\n", 1)[0][:200].decode(
                    "latin-1")
                with self._lock:
                    self.refused.append(asked)
                _refuse(conn, asked)
                return
            with self._lock:
                self.passed.append(str(target))
            out = self._connect(target)
            self._track(out)
            if method == b"CONNECT":
                conn.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            else:
                # to the allowed server itself, as a server expects it: whatever the client
                # sends next on this connection reaches that server and no other
                out.sendall(_origin_form(head))
            if rest:
                out.sendall(rest)
            _pump_both(conn, out)
        except (OSError, ValueError):
            pass
        finally:
            self._forget(conn)
            if out is not None:
                self._forget(out)

    def _connect(self, target: Endpoint) -> socket.socket:
        """A connection to `target` alone: straight, or a tunnel through the upstream proxy
        (plain HTTP too: handed to a proxy as it came, a keep-alive connection's next
        request could name another host)."""
        if self.upstream is None:
            return socket.create_connection((target.host, target.port), CONNECT_TIMEOUT_S)
        out = socket.create_connection((self.upstream.host, self.upstream.port),
                                       CONNECT_TIMEOUT_S)
        out.sendall(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode())
        reply, extra = _read_head(out)
        if reply.split(b" ", 2)[1:2] != [b"200"] or extra:
            out.close()
            raise ValueError(f"upstream proxy refused {target}")
        return out

    def _forget(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.discard(sock)
        with contextlib.suppress(OSError):
            sock.close()

    def close(self) -> None:
        """Stop serving. No thread is left blocked on a descriptor this closes: a system
        call blocked on a closed descriptor is restarted by the kernel with the same
        number (when the process is stopped and continued; on Linux 6.18 also when it
        starts a subprocess), and that number may be another socket's by then. An
        accept() left waiting here took the connections of whatever listener the process
        opened next (a server on loopback got this proxy's 403). So the listener is shut
        down, which wakes the accept, and closed only once the accepting thread is gone;
        each open connection is shut down (waking its readers) before it is closed."""
        with self._lock:
            self._closed.set()
            socks, self._open = list(self._open), set()
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        if self._acceptor is not threading.current_thread():
            self._acceptor.join(timeout=CLOSE_WAIT_S)
        if not self._acceptor.is_alive():  # else left open: never a number to reuse
            with contextlib.suppress(OSError):
                self._server.close()
        for sock in socks:
            _end(sock)
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Proxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _read_head(sock: socket.socket) -> tuple[bytes, bytes]:
    """The request (or reply) head up to its blank line, and what came after it."""
    data = b""
    sock.settimeout(CONNECT_TIMEOUT_S)
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            raise ValueError("connection closed before a full request")
        data += chunk
        if len(data) > HEAD_LIMIT:
            raise ValueError("request head too long")
    sock.settimeout(None)
    head, _, rest = data.partition(b"\r\n\r\n")
    return head + b"\r\n\r\n", rest


def _request_target(head: bytes) -> tuple[bytes, Endpoint | None]:
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ")
    if len(parts) != 3:
        return b"", None
    method, target = parts[0].upper(), parts[1].decode("latin-1")
    if method == b"CONNECT":
        return method, endpoint(target) if ":" in target else None
    if target.startswith("http://"):
        return method, endpoint(target)
    return method, None  # origin-form: not a proxy request, nothing to allow


def _origin_form(head: bytes) -> bytes:
    """`GET http://h:p/x HTTP/1.1` -> `GET /x HTTP/1.1`, for a server reached directly."""
    line, _, headers = head.partition(b"\r\n")
    method, target, version = line.split(b" ")
    path = urlsplit(target.decode("latin-1"))
    origin = (path.path or "/") + (f"?{path.query}" if path.query else "")
    return b" ".join([method, origin.encode("latin-1"), version]) + b"\r\n" + headers


def _end(sock: socket.socket) -> None:
    """Shut a socket down (whoever is blocked reading or writing it returns) and close it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def _refuse(conn: socket.socket, asked: str) -> None:
    body = (f"ratchet: {asked} is not an endpoint this agent may reach (its model's "
            "endpoints only: [agent] allow)\n").encode()
    with contextlib.suppress(OSError):
        conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\n"
                     + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                     + body)


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(1 << 16):
            dst.sendall(chunk)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def _pump_both(a: socket.socket, b: socket.socket) -> None:
    back = threading.Thread(target=_pump, args=(b, a), daemon=True)
    back.start()
    _pump(a, b)
    back.join()
