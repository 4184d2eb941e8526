"""Run untrusted commands: own process group, capped logs, deadlines that kill the tree.

Peers' users' top complaint is a timeout that does not stop the work. A thread cannot
kill runaway work; a process group can, and a child subreaper (Linux) makes sure even a
grandchild that called setsid() and outlived its parent is found and killed.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import resource
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
KILL_GRACE_S = 2.0


def become_subreaper() -> bool:
    """Orphans of our descendants re-parent to us, so we can always reap and kill them."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def kill_descendants(grace_s: float = KILL_GRACE_S) -> int:
    """SIGTERM then SIGKILL every descendant of this process; returns how many there were."""
    import psutil  # imported here: the worker's start-up time is every candidate's overhead

    try:
        me = psutil.Process()
        children = me.children(recursive=True)
    except psutil.Error:
        return 0
    if not children:
        return 0
    for child in children:
        with contextlib.suppress(psutil.Error):
            child.terminate()
    _, alive = psutil.wait_procs(children, timeout=grace_s)
    for child in alive:
        with contextlib.suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    # reap anything that re-parented to us meanwhile
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    return len(children)


def kill_group(pgid: int, grace_s: float = KILL_GRACE_S) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def kill_tree(pid: int, grace_s: float = KILL_GRACE_S) -> None:
    """Kill a process and all its descendants (used when the process is not our child)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()


class CappedLog:
    """Drain a pipe into a file, keeping the head and the tail within `limit` bytes.

    The pipe is always drained to the end, so a process printing gigabytes never blocks
    on a full pipe and never fills the disk.
    """

    def __init__(self, path: Path, limit: int) -> None:
        self.path = path
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def feed(self, chunk: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            excess = len(self.tail) - self.tail_limit
            if excess > 0:
                del self.tail[:excess]
                self.dropped += excess

    def drain(self, stream) -> None:
        while True:
            chunk = stream.read1(1 << 16) if hasattr(stream, "read1") else stream.read(1 << 16)
            if not chunk:
                break
            self.feed(chunk)

    def text(self) -> str:
        return self.content().decode("utf-8", "replace")

    def content(self) -> bytes:
        if not self.dropped:
            return bytes(self.head + self.tail)
        marker = f"\n[ratchet: {self.dropped} bytes of output dropped]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)  # a candidate may delete it
        self.path.write_bytes(self.content())


def _limits(memory_limit_bytes: int | None, file_size_limit_bytes: int | None = None):
    def apply() -> None:
        if memory_limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
        if file_size_limit_bytes:  # a runaway writer gets EFBIG / SIGXFSZ, not a full disk
            limit = file_size_limit_bytes
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        # no core dumps from crashing candidates filling the job directory
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


def run_capped(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    log_path: Path,
    deadline: float,
    log_limit: int,
    memory_limit_bytes: int | None = None,
    should_stop=lambda: False,
    reap_all_descendants: bool = True,
    file_size_limit_bytes: int | None = None,
    pass_fds: tuple[int, ...] = (),
) -> tuple[int | None, bool, CappedLog, float]:
    """Run argv in a fresh session; return (exit code, timed_out, log, seconds).

    exit code is None when the process was killed by us (timeout / stop); a negative
    code is a signal that killed it (e.g. -9 from the OOM killer).
    """
    log = CappedLog(log_path, log_limit)
    start = time.monotonic()
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
        preexec_fn=_limits(memory_limit_bytes, file_size_limit_bytes),
        pass_fds=pass_fds,  # every other descriptor is closed in the child
    )
    drainer = threading.Thread(target=log.drain, args=(proc.stdout,), daemon=True)
    drainer.start()
    timed_out = stopped = False
    while True:
        try:
            proc.wait(timeout=0.01)
            break
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() >= deadline:
            timed_out = True
        elif should_stop():
            stopped = True
        if timed_out or stopped:
            kill_group(proc.pid)
            proc.wait()
            break
    # The group may have left children behind (daemonised, setsid): kill them all so the
    # next phase starts clean and the pipe reaches EOF. Only the worker (a subreaper whose
    # every child is candidate code) may do this; a driver kills the group alone.
    if reap_all_descendants:
        kill_descendants(grace_s=0.5)
    else:
        kill_group(proc.pid, grace_s=0.5)
    drainer.join(timeout=5)
    if proc.stdout:
        proc.stdout.close()
    log.save()
    seconds = time.monotonic() - start
    code = None if (timed_out or stopped) else proc.returncode
    return code, timed_out, log, seconds
