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
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

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


def _no_children() -> bool:
    """True when this process has no child at all (so, being a subreaper, no descendant:
    an orphan of ours is re-parented to us). One small read per thread, where scanning
    every process of the machine (psutil) costs milliseconds after every phase. False
    when the kernel does not say (no /proc/<pid>/task/<tid>/children)."""
    try:
        tasks = os.listdir("/proc/self/task")
        for tid in tasks:
            with open(f"/proc/self/task/{tid}/children", "rb") as fh:
                if fh.read().strip():
                    return False
    except OSError:
        return False
    return bool(tasks)


def kill_descendants(grace_s: float = KILL_GRACE_S) -> int:
    """SIGTERM then SIGKILL every descendant of this process; returns how many there were."""
    if _no_children():
        return 0
    import psutil  # imported here: the worker's start-up time is every candidate's overhead

    try:
        me = psutil.Process()
        children = me.children(recursive=True)
    except psutil.Error:
        return 0
    if not children:
        return 0
    psutil.wait_procs(_terminate_then_kill(children, grace_s), timeout=grace_s)
    # reap anything that re-parented to us meanwhile
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass
    return len(children)


def _terminate_then_kill(procs: list, grace_s: float) -> list:
    """SIGTERM each of `procs` (psutil processes), SIGKILL those still alive after
    `grace_s`; returns the ones that had to be killed."""
    import psutil

    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    return alive


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
    _terminate_then_kill(procs, grace_s)


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
        self._live: IO[bytes] | None = None
        self._live_failed = False

    def _stream(self, data: bytes) -> None:
        """The head also goes to the file as it comes, so the study's live views (a log's
        tail, a training curve) can read a running phase; `save` writes the whole log."""
        if self._live_failed or not data:
            return
        try:
            if self._live is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._live = open(self.path, "wb")  # noqa: SIM115 - closed by save
            self._live.write(data)
            self._live.flush()
        except (OSError, ValueError):  # ValueError: closed by `save` meanwhile
            self._live_failed = True  # a view's convenience: the log itself is in memory

    def feed(self, chunk: bytes) -> None:
        room = self.head_limit - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            self._stream(chunk[:room])
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
        self._live_failed = True  # a late chunk must not reopen (and empty) the saved log
        if self._live is not None:
            with contextlib.suppress(OSError):
                self._live.close()
            self._live = None
        self.path.parent.mkdir(parents=True, exist_ok=True)  # a candidate may delete it
        self.path.write_bytes(self.content())


def _limits(memory_limit_bytes: int | None, file_size_limit_bytes: int | None = None,
            before_exec: Callable[[], None] | None = None):
    def apply() -> None:
        if before_exec is not None:  # e.g. join the job's pids cgroup
            before_exec()
        if memory_limit_bytes:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit_bytes, memory_limit_bytes))
        if file_size_limit_bytes:  # a runaway writer gets EFBIG / SIGXFSZ, not a full disk
            limit = file_size_limit_bytes
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        # no core dumps from crashing candidates filling the job directory
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


# a running phase's deadline, stop request and bounds are looked at this often (the
# disk reserve's statvfs is paced at limits.STATVFS_EVERY_S, no faster)
CHECK_EVERY_S = 0.02


class _ExitWait:
    """`wait(timeout)`: True once the process has ended (and is reaped), waiting at most
    `timeout`. On a pidfd (Linux 5.3+) the wait wakes the moment the process ends;
    `Popen.wait(timeout)` instead polls waitpid and sleeps, about five times a wait:
    with a check every 20 ms, a tenth of a CPU-second per 3-second phase in the worker,
    beside the candidates being timed."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.fd: int | None = None
        self.poller = select.poll()
        with contextlib.suppress(AttributeError, OSError):  # older kernel: Popen's wait
            self.fd = os.pidfd_open(proc.pid)
            self.poller.register(self.fd, select.POLLIN)

    def wait(self, timeout: float) -> bool:
        if self.fd is None:
            try:
                self.proc.wait(timeout=timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        if self.proc.poll() is not None:
            return True
        self.poller.poll(timeout * 1000)  # readable once the process has ended
        return self.proc.poll() is not None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


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
    reap_all_descendants: bool = False,
    file_size_limit_bytes: int | None = None,
    pass_fds: tuple[int, ...] = (),
    stop_grace_s: float | Callable[[], float] = KILL_GRACE_S,
    before_exec: Callable[[], None] | None = None,
) -> tuple[int | None, bool, CappedLog, float]:
    """Run argv in a fresh session; return (exit code, timed_out, log, seconds).

    exit code is None when the process was killed by us (timeout / stop); a negative
    code is a signal that killed it (e.g. -9 from the OOM killer). `stop_grace_s`: how
    long a tree stopped by `should_stop` gets between SIGTERM and SIGKILL (or a function
    asked once it stops); `before_exec`: called in the child before it starts `argv`.
    `reap_all_descendants`: end by killing (and reaping) every descendant of this
    process, not only argv's process group. Only a job's worker may ask for it: it is a
    subreaper whose every child is candidate code. Anywhere else (the driver preparing
    data, a Ray worker) the process's other children are not argv's.
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
        preexec_fn=_limits(memory_limit_bytes, file_size_limit_bytes, before_exec),
        pass_fds=pass_fds,  # every other descriptor is closed in the child
    )
    drainer = threading.Thread(target=log.drain, args=(proc.stdout,), daemon=True)
    drainer.start()
    timed_out = stopped = False
    exit_wait = _ExitWait(proc)
    try:
        while not exit_wait.wait(CHECK_EVERY_S):
            if time.monotonic() >= deadline:
                timed_out = True
            elif should_stop():
                stopped = True
            if timed_out or stopped:
                grace = stop_grace_s() if callable(stop_grace_s) else stop_grace_s
                kill_group(proc.pid, **({"grace_s": grace} if stopped else {}))
                proc.wait()
                break
    finally:
        exit_wait.close()
    # The group may have left children behind (daemonised, setsid): kill them all so the
    # next phase starts clean and the pipe reaches EOF. Only the worker (a subreaper whose
    # every child is candidate code) may do this; a driver kills the group alone.
    if reap_all_descendants:
        kill_descendants(grace_s=0.5)
    else:
        kill_group(proc.pid, grace_s=0.5)
    drainer.join(timeout=5)
    if proc.stdout and not drainer.is_alive():
        # closed only once nothing reads it: a descendant still holding the pipe would
        # keep the close waiting on the reader's lock, or (closed under a raw read) let the
        # kernel restart that read on whatever takes the number next (egress.Proxy.close)
        proc.stdout.close()
    log.save()
    seconds = time.monotonic() - start
    code = None if (timed_out or stopped) else proc.returncode
    return code, timed_out, log, seconds


# ---------------------------------------------------------------------------------------
# peak memory of a phase's process tree (the `memory_gb` column)

WRAPPERS = {"sh", "dash", "bash", "unshare", "bwrap", "timeout", "env", "nice", "taskset"}
GPU_QUERY = ["--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"]


def _high_water_kib(pid: int) -> int:
    """The kernel's per-process peak RSS (VmHWM), in KiB; 0 if gone or unreadable."""
    try:
        with open(f"/proc/{pid}/status", "rb") as fh:
            for line in fh:
                if line.startswith(b"VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


class PeakMemory:
    """Peak memory of this process's descendants during one phase, sampled by a thread.

    The worker runs one phase at a time and every descendant belongs to it. Two views:
    the whole tree (a training `run` phase), and only what the evaluator started (its
    child processes, e.g. the candidate in the two-process harness), so an evaluator's
    own footprint is never counted as the candidate's. Each figure is a lower bound of
    the true peak: the largest of (summed RSS at any sample, any one process's kernel
    high-water mark, and, for the whole tree, the largest reaped descendant's rusage).
    GPU memory comes from nvidia-smi where it is installed, for the tree's pids.
    """

    def __init__(self, interval_s: float = 0.5, gpu_interval_s: float = 1.0) -> None:
        import shutil

        self.interval_s = interval_s
        self.gpu_interval_s = gpu_interval_s
        self.smi = shutil.which("nvidia-smi")
        self.tree_rss = self.child_rss = 0  # bytes
        self.tree_gpu = self.child_gpu = 0  # bytes
        self.gpu_seen = False  # nvidia-smi answered at least once
        self.child_seen = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._rusage_before = 0
        self._last_gpu = 0.0

    def __enter__(self) -> PeakMemory:
        self._rusage_before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        if after > self._rusage_before:  # a descendant of this phase peaked at `after` KiB
            self.tree_rss = max(self.tree_rss, after * 1024)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            with contextlib.suppress(Exception):  # measuring must never break a job
                self.sample()

    @staticmethod
    def _split(procs) -> tuple[list, list]:
        """(every process, the evaluator's descendants): below the wrappers' chain."""
        import psutil

        by_parent: dict[int, list] = {}
        living = []
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue  # e.g. an orphan of a probe, re-parented to us, not yet reaped
                by_parent.setdefault(proc.ppid(), []).append(proc)
                living.append(proc)
        procs = living
        node = by_parent.get(os.getpid(), [])
        while len(node) == 1:
            proc = node[0]
            try:
                name = proc.name()
            except psutil.Error:
                return procs, []
            kids = by_parent.get(proc.pid, [])
            if name not in WRAPPERS:  # the evaluator (or the run command) itself
                below, todo = [], list(kids)
                while todo:
                    child = todo.pop()
                    below.append(child)
                    todo.extend(by_parent.get(child.pid, []))
                return procs, below
            node = kids
        return procs, []

    def sample(self) -> None:
        import psutil

        procs = psutil.Process().children(recursive=True)
        every, below = self._split(procs)
        self.tree_rss = max(self.tree_rss, self._rss(every))
        if below:
            self.child_seen = True
            self.child_rss = max(self.child_rss, self._rss(below))
        if self.smi and time.monotonic() - self._last_gpu >= self.gpu_interval_s:
            self._last_gpu = time.monotonic()
            used = self._gpu_by_pid()
            if used is not None:
                self.gpu_seen = True
                self.tree_gpu = max(self.tree_gpu, sum(used.get(p.pid, 0) for p in every))
                self.child_gpu = max(self.child_gpu, sum(used.get(p.pid, 0) for p in below))

    @staticmethod
    def _rss(procs) -> int:
        import psutil

        total, peak_one = 0, 0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                total += proc.memory_info().rss
            peak_one = max(peak_one, _high_water_kib(proc.pid) * 1024)
        return max(total, peak_one)

    def _gpu_by_pid(self) -> dict[int, int] | None:
        if self.smi is None:  # no nvidia-smi here (or it stopped answering)
            return None
        try:
            out = subprocess.run([self.smi, *GPU_QUERY], capture_output=True, text=True,
                                 timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            self.smi = None  # stop asking a tool that hangs or vanished
            return None
        if out.returncode != 0:
            return None
        used: dict[int, int] = {}
        for line in out.stdout.splitlines():
            parts = [p.strip() for p in line.split(",")]
            with contextlib.suppress(ValueError, IndexError):
                used[int(parts[0])] = used.get(int(parts[0]), 0) + int(float(parts[1])) * (1 << 20)
        return used
