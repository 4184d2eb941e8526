"""The warden: the trusted first process of every sandbox (stdlib only, no package).

Started as `python -I -S -c "...import warden; sys.exit(warden.main())"` with this file's
directory last on sys.path (sandbox.WARDEN_ARGV: from its cached bytecode), or by hand as

    python -I -S warden.py [--uid U --gid G] [--drop-caps] [--pidns] [--no-network] [--bridge PORT:SOCKET]
                           [--control-fd N] [--keep-fd N]...
                           [--cover D]... [--bind-ro P]... [--bind-rw P]... [--hide D]... -- argv...

Every untrusted party (a proposer's agent CLI, a candidate's build/run/smoke phase, the
evaluator's candidate child) starts as a child of a warden. The warden

- is PID 1 (or 2, under bubblewrap's own init) of the sandbox's PID namespace when there is
  one (`--pidns`), otherwise a child subreaper, so every process the party starts, daemons
  that called setsid() included, stays in reach;
- as root, drops the party to an unprivileged uid/gid (`--uid/--gid`, no supplementary
  groups, no_new_privs): it cannot read the trusted processes' /proc entries, environments
  or descriptors, signal them, or write a file root owns;
- with `--drop-caps` (it runs as root of a user namespace `unshare` made, not as real
  root, so it has no uid to drop to) takes every capability from the party for good;
- closes every descriptor but stdio and `--keep-fd`;
- with `--no-network` (outside bubblewrap, which has `--unshare-net`) moves itself, and so
  the party, into a new network namespace with only loopback, brought up: the machine's
  loopback services (a Ray head's job server, `ratchet serve`) and every other network are
  out of reach, while the party's own loopback servers still work;
- with `--bridge PORT:SOCKET` (a party with no network but an allow-listing proxy: the
  agents, `egress.py`) listens on 127.0.0.1:PORT inside the party's namespace and relays
  each connection to the proxy's Unix socket, the party's only way out;
- with `--cover/--bind-*/--hide` (a PID namespace made by `unshare`, which gives a private
  mount namespace but no bubblewrap) builds the party's view of the filesystem itself;
- on `--control-fd` answers `F` (freeze every process of the sandbox with SIGSTOP; the
  answer `f` comes once all of them are stopped) and `T` (SIGCONT; answer `t`);
- when the party's first process exits, kills every process left in the sandbox and exits
  with the party's status (128 + signal when it was killed); SIGTERM/SIGINT to the warden
  do the same to the whole sandbox.

Which processes are "the sandbox's": in a PID namespace, every process but the warden and
bubblewrap's init (the namespace holds nothing else); otherwise the warden's descendants
(a subreaper: a daemon that called setsid() is re-parented to it, never lost).
"""

from __future__ import annotations

# Every untrusted party pays this start-up, so only cheap modules: `_signal` (not `signal`,
# which builds enums), no json, no contextlib. The argv is resolved here (not by execvp,
# which imports `warnings` after the uid drop, when a private stdlib may be unreadable).
import _signal as signal
import os
import select
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_CAP_AMBIENT = 24, 28, 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
# uid 0 gains no capabilities on exec, and nothing can undo that (NOROOT and its lock;
# no fix-ups on setuid, locked)
SECURE_NOROOT = 0x1 | 0x2 | 0x4 | 0x8
LAST_CAP = 63
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND = 1, 2, 4, 32, 4096
MS_REC, MS_PRIVATE = 16384, 1 << 18
CLONE_NEWNET = 0x40000000
SIOCSIFFLAGS = 0x8914
IFF_UP, IFF_LOOPBACK, IFF_RUNNING = 0x1, 0x8, 0x40
STOPPED = frozenset("TtZX")
_LIBC: list = []  # the loaded libc, once asked for


def _libc():  # noqa: ANN202 - ctypes costs ~10 ms of start-up: loaded only where a syscall needs it
    if not _LIBC:
        import ctypes

        _LIBC.append(ctypes.CDLL(None, use_errno=True))
    return _LIBC[0]


def _errno() -> str:
    import ctypes

    return os.strerror(ctypes.get_errno())


def _no_new_privs() -> bool:
    """Already set (bubblewrap sets it for everything it starts)?"""
    try:
        with open("/proc/self/status", "rb") as fh:
            return b"NoNewPrivs:\t1" in fh.read()
    except OSError:
        return False


class Options:
    def __init__(self, args: list[str]) -> None:
        self.uid: int | None = None
        self.gid: int | None = None
        self.pidns = False
        self.no_network = False
        self.drop_caps = False
        self.bridge: tuple[int, str] | None = None
        self.control_fd: int | None = None
        self.keep_fds: list[int] = []
        self.mount_plan: dict[str, list[str]] = {}
        while args and args[0] != "--":
            flag = args.pop(0)
            if flag == "--pidns":
                self.pidns = True
            elif flag == "--no-network":
                self.no_network = True
            elif flag == "--drop-caps":
                self.drop_caps = True
            elif flag == "--bridge":
                port, _, path = args.pop(0).partition(":")
                self.bridge = (int(port), path)
            elif flag == "--uid":
                self.uid = int(args.pop(0))
            elif flag == "--gid":
                self.gid = int(args.pop(0))
            elif flag == "--control-fd":
                self.control_fd = int(args.pop(0))
            elif flag == "--keep-fd":
                self.keep_fds.append(int(args.pop(0)))
            elif flag in ("--cover", "--hide", "--bind-ro", "--bind-rw"):
                self.mount_plan.setdefault(flag[2:], []).append(args.pop(0))
            else:
                raise SystemExit(f"warden: unknown option {flag}")
        if not args or len(args) < 2:
            raise SystemExit("warden: no command after --")
        self.argv = args[1:]
        # kill(-1, ...) as root outside a PID namespace would reach the whole machine: only
        # trust --pidns when this process really is the first (or bubblewrap init's first
        # child) of a fresh namespace. The host's PIDs 1 and 2 are init and kthreadd.
        if self.pidns and os.getpid() > 2:
            self.pidns = False


def _die(message: str) -> None:
    os.write(2, f"ratchet sandbox: {message}\n".encode())
    os._exit(126)


def _mount(source: bytes, target: str, fstype: bytes | None, flags: int,
           data: bytes | None = None) -> None:
    if _libc().mount(source, target.encode(), fstype, flags, data) != 0:
        _die(f"cannot mount {target}: {_errno()}")


def apply_mount_plan(plan: dict[str, list[str]]) -> None:
    """unshare gave a private mount namespace and no bubblewrap: build the party's view.

    `cover`: directories replaced by an empty tmpfs (private homes, /tmp, /dev/shm);
    `bind-ro`/`bind-rw`: paths put back afterwards, from descriptors opened before any
    cover hid them; `hide`: directories emptied last (hold-out data inside a tree).
    """
    if not plan:
        return
    _mount(b"none", "/", None, MS_REC | MS_PRIVATE)  # nothing mounted here leaks out
    held = []
    binds = [(p, False) for p in plan.get("bind-ro", [])] + [(p, True) for p in plan.get("bind-rw", [])]
    for path, writable in binds:
        if os.path.exists(path):
            held.append((path, writable, os.open(path, os.O_PATH | os.O_CLOEXEC)))
    for path in plan.get("cover", []):
        if os.path.isdir(path):
            # /tmp and /dev/shm stay writable by all (sticky) as the real ones are
            mode = b"mode=1777" if path in ("/tmp", "/dev/shm") else b"mode=0755"
            _mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, mode)
    for path, writable, fd in held:
        if not os.path.exists(path):  # a cover hid it: make the mount point again
            if os.path.isdir(f"/proc/self/fd/{fd}"):
                os.makedirs(path, exist_ok=True)
            else:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
        _mount(f"/proc/self/fd/{fd}".encode(), path, None, MS_BIND | MS_REC)
        if not writable:
            _mount(b"none", path, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC)
        os.close(fd)
    for path in plan.get("hide", []):
        if os.path.isdir(path):
            _mount(b"tmpfs", path, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755")


def isolate_network() -> None:
    """A network namespace of our own (the party's after the fork), its loopback up: the
    new namespace's `lo` starts down, and tests that serve on 127.0.0.1 need it. Fails
    closed: a party that was to have no network never starts with the machine's."""
    libc = _libc()
    if libc.unshare(CLONE_NEWNET) != 0:
        _die(f"cannot make a network namespace: {_errno()}")
    fd = libc.socket(2, 2, 0)  # AF_INET, SOCK_DGRAM: any socket takes interface ioctls
    if fd < 0:
        _die(f"cannot bring loopback up: {_errno()}")
    flags = IFF_UP | IFF_LOOPBACK | IFF_RUNNING
    # struct ifreq: the name (16 bytes), then ifr_flags (a short) in a 24-byte union
    import ctypes

    ifreq = ctypes.create_string_buffer(b"lo".ljust(16, b"\0") + flags.to_bytes(2, sys.byteorder), 40)
    status = libc.ioctl(fd, SIOCSIFFLAGS, ifreq)
    os.close(fd)
    if status != 0:
        _die(f"cannot bring loopback up: {_errno()}")


def bridge_listener(port: int) -> object:
    """The socket the party reaches its proxy on, bound before the party starts (so it is
    there, and the party cannot take the port first). `_socket`, not `socket`: the module
    (enum, selectors) would cost every agent's start-up ~10 ms."""
    import _socket

    server = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
    server.setsockopt(_socket.SOL_SOCKET, _socket.SO_REUSEADDR, 1)
    try:
        server.bind(("127.0.0.1", port))
    except OSError as exc:
        _die(f"cannot listen on 127.0.0.1:{port} for the proxy: {exc}")
    server.listen(64)
    return server


def serve_bridge(server, path: str) -> None:  # noqa: ANN001 - a _socket.socket
    """Relay every connection to 127.0.0.1:PORT to the proxy's Unix socket, on threads of
    their own (the warden's loop stays as it is). A party that cannot reach the proxy just
    fails to connect."""
    import _socket
    import _thread

    def pump(src, dst) -> None:  # noqa: ANN001
        try:
            while True:
                chunk = src.recv(65536)
                if not chunk:
                    break
                dst.sendall(chunk)
        except OSError:
            pass
        try:  # noqa: SIM105 - contextlib costs every party start-up time
            dst.shutdown(_socket.SHUT_WR)
        except OSError:
            pass

    def relay(fd: int) -> None:
        conn = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM, 0, fd)
        out = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
        try:
            out.connect(path)
        except OSError:
            conn.close()
            out.close()
            return
        done = _thread.allocate_lock()
        done.acquire()

        def back() -> None:
            pump(out, conn)
            done.release()

        _thread.start_new_thread(back, ())
        pump(conn, out)
        done.acquire()
        conn.close()
        out.close()

    def accept() -> None:
        while True:
            try:
                fd, _ = server._accept()
            except OSError:
                return
            _thread.start_new_thread(relay, (fd,))

    _thread.start_new_thread(accept, ())


def _child(opts: Options) -> None:
    """In the forked child: become the party (never returns)."""
    try:
        os.setsid()
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_SETMASK, [])
        if opts.uid is not None:
            gid = opts.gid if opts.gid is not None else opts.uid
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(opts.uid, opts.uid, opts.uid)
            if os.geteuid() == 0 or os.getuid() == 0:
                _die("could not drop root")
        if opts.drop_caps:
            drop_capabilities()
        if not _no_new_privs() and _libc().prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            _die("could not set no_new_privs")
        keep = sorted({0, 1, 2, *opts.keep_fds})
        low = 0
        for fd in keep:
            if low < fd:  # closerange(n, n) closes everything from n up on some Pythons
                os.closerange(low, fd)
            low = fd + 1
        os.closerange(low, 1 << 16)
        for fd in opts.keep_fds:
            os.set_inheritable(fd, True)
        os.execv(_resolve(opts.argv[0]), opts.argv)
    except OSError as exc:
        _die(f"cannot start {opts.argv[0]}: {exc}")
    except BaseException as exc:  # never fall back into the warden's own loop
        _die(f"cannot start {opts.argv[0]}: {type(exc).__name__}: {exc}")


def drop_capabilities() -> None:
    """The party keeps uid 0 of a user namespace but none of its capabilities: it cannot
    unmount what hides paths from it, nor mount, nor make namespaces of its own with them."""
    libc = _libc()
    if libc.prctl(PR_SET_SECUREBITS, SECURE_NOROOT, 0, 0, 0) != 0:
        _die(f"could not drop capabilities: {_errno()}")
    for cap in range(LAST_CAP + 1):
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the kernel's last: fine
    libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)


def _resolve(program: str) -> str:
    if "/" in program:
        return program
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", program)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise FileNotFoundError(f"{program} is not on PATH")


def _state(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return None


def children(pid: int) -> list[int]:
    """The direct children of every thread of `pid` (Linux: /proc/<pid>/task/*/children);
    [] once it is gone. The evaluator's tree walk (isolate) uses this one too."""
    out: list[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", "rb") as fh:
                out += [int(p) for p in fh.read().split()]
    except OSError:
        pass
    return out


class Sandbox:
    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self.me = os.getpid()
        self.exited: dict[int, int] = {}  # every child reaped so far: pid -> wait status

    def members(self) -> list[int]:
        """Every process of the sandbox but the warden (see the module docstring)."""
        if self.opts.pidns:
            return [int(p) for p in os.listdir("/proc")
                    if p.isdigit() and int(p) not in (self.me, 1)]
        found, todo = [], children(self.me)
        while todo:
            pid = todo.pop()
            found.append(pid)
            todo += children(pid)
        return found

    def signal_all(self, sig: int) -> list[int]:
        pids = self.members()
        for pid in pids:
            try:  # noqa: SIM105 - contextlib costs every party start-up time
                os.kill(pid, sig)
            except OSError:  # gone already
                pass
        return pids

    def freeze(self) -> None:
        """SIGSTOP every member, again for any that appeared meanwhile, until all are stopped."""
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            pids = self.signal_all(signal.SIGSTOP)
            if all(_all_tasks_stopped(pid) for pid in pids) and set(self.members()) <= set(pids):
                return
            time.sleep(0.0002)

    def kill_all(self) -> None:
        for _ in range(50):
            if not self.signal_all(signal.SIGKILL):
                return
            self.reap()
            time.sleep(0.01)

    def reap(self) -> None:
        while True:
            try:  # noqa: SIM105 - contextlib costs every party start-up time
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            self.exited[pid] = status


def _all_tasks_stopped(pid: int) -> bool:
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True  # gone
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0].decode()
        except (OSError, IndexError):
            continue
        if state not in STOPPED:
            return False
    return True


def main() -> int:
    opts = Options(sys.argv[1:])
    if not opts.pidns:
        _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    apply_mount_plan(opts.mount_plan)
    if opts.no_network:
        isolate_network()
    # in the party's namespace (ours, or bubblewrap's --unshare-net): bound before the fork
    bridge = bridge_listener(opts.bridge[0]) if opts.bridge else None
    sandbox = Sandbox(opts)
    # SIGCHLD and stop requests wake the loop through one pipe, so nothing is polled
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    stop_requested: list[int] = []
    signal.signal(signal.SIGCHLD, lambda *_: None)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: stop_requested.append(signum))
    pid = os.fork()
    if pid == 0:
        signal.set_wakeup_fd(-1)
        os.close(wake_r)
        os.close(wake_w)
        if opts.control_fd is not None:
            os.close(opts.control_fd)
        _child(opts)
    if bridge is not None and opts.bridge is not None:
        serve_bridge(bridge, opts.bridge[1])
    control = opts.control_fd
    status: int | None = None
    term_sent_at: float | None = None
    while status is None:
        readable = [wake_r] + ([control] if control is not None else [])
        timeout = 0.2 if term_sent_at is not None else None
        try:
            ready, _, _ = select.select(readable, [], [], timeout)
        except InterruptedError:
            ready = []
        if wake_r in ready:
            try:  # noqa: SIM105 - contextlib costs every party start-up time
                os.read(wake_r, 512)
            except BlockingIOError:  # drained by an earlier wake-up
                pass
        if control is not None and control in ready:
            try:  # noqa: SIM105 - contextlib costs every party start-up time
                command = os.read(control, 1)
            except OSError:
                command = b""
            if command == b"F":
                sandbox.freeze()
                os.write(control, b"f")
            elif command == b"T":
                sandbox.signal_all(signal.SIGCONT)
                os.write(control, b"t")
            elif command == b"":  # the trusted side went away: end the sandbox
                control = None
                stop_requested.append(signal.SIGTERM)
        if stop_requested and term_sent_at is None:
            sandbox.signal_all(signal.SIGCONT)
            sandbox.signal_all(signal.SIGTERM)
            term_sent_at = time.monotonic()
        if term_sent_at is not None and time.monotonic() - term_sent_at > 2.0:
            sandbox.kill_all()
        sandbox.reap()
        status = sandbox.exited.get(pid)
    sandbox.kill_all()  # daemons left behind die with the party
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main())
