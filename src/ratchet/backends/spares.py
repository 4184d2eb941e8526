"""Standby workers for the local backend, forked by one spare server.

A job starts in milliseconds when a worker is already up with its modules loaded. Each
standby worker used to be a new interpreter (~85 ms of CPU here, spent while other
candidates are being timed); now one server process (`python -m ratchet.job.worker
--spare-server`) loads once and forks a spare per request, for about a millisecond each.

The hand-over keeps the standby protocol: the driver writes the job's pid.json (the
spare's pid and start time) before it names the job, so a driver killed in between leaves
a job that a restarted driver finds placed but never started, and places again. Spares
are not this process's children, so they are watched by pid and start time.
"""

from __future__ import annotations

import contextlib
import functools
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

SPARE_WAIT_S = 5.0  # the longest a placement waits for a spare already asked for


_PROC = Path("/proc")
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@functools.cache
def _boot_time() -> float:
    """The machine's boot time, read once (psutil reads /proc/stat for it every call)."""
    return psutil.boot_time()


def running(pid: int, created: float) -> bool:
    """The process `pid` that started at `created` (pids are reused) runs, not a zombie.

    Asked for every job in flight at every poll: where there is a /proc, one read of
    /proc/<pid>/stat (its state, and its start as psutil reckons create_time), instead of
    psutil's three reads and a read of /proc/stat each time."""
    if not _PROC.is_dir():
        try:
            proc = psutil.Process(pid)
            return abs(proc.create_time() - created) <= 1.0 and \
                proc.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        state, start_ticks = fields[0], int(fields[19])  # fields 3 and 22 of proc(5)
    except (OSError, IndexError, ValueError):
        return False
    return state != b"Z" and abs(_boot_time() + start_ticks / _TICKS - created) <= 1.0


class Spare:
    """A standby worker forked by the spare server (or the worker it became)."""

    def __init__(self, pid: int, created: float) -> None:
        self.pid, self.created = pid, created

    def poll(self) -> int | None:
        """None while it runs (Popen's meaning); its exit status is not ours to read."""
        return None if running(self.pid, self.created) else 0

    def wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"spare {self.pid}", timeout)
            time.sleep(0.01)

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)


class SpareServer:
    """The driver's side of `--spare-server`: ask for spares, take one, name its job."""

    def __init__(self, cwd: Path, env: dict[str, str], log: Path,
                 wait_s: float = SPARE_WAIT_S) -> None:
        self.cwd, self.env, self.log, self.wait_s = cwd, env, log, wait_s
        self._proc: subprocess.Popen | None = None
        self._ready: list[Spare] = []
        self._pending = 0  # asked for, not answered yet
        self._buffer = b""

    def _server(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            self._end_server(grace_s=0)  # a dead one: its pipes are closed
            with self.log.open("ab") as log:  # the server's own errors, if any
                self._proc = subprocess.Popen(
                    [sys.executable, "-m", "ratchet.job.worker", "--spare-server"],
                    env=self.env,  # never the driver's keys
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    start_new_session=True,
                    cwd=self.cwd,
                )
            self._ready, self._pending, self._buffer = [], 0, b""
        return self._proc

    def count(self) -> int:
        """Spares up or on their way (a spare that died idle is found out at take())."""
        self._collect(0)
        return len(self._ready) + self._pending

    def request(self, n: int) -> None:
        if n <= 0:
            return
        server = self._server()
        assert server.stdin is not None  # started with stdin=PIPE
        try:
            server.stdin.write(b"spawn\n" * n)
            server.stdin.flush()
        except OSError:
            return  # the server died: the next call starts another
        self._pending += n

    def take(self) -> Spare | None:
        """A live spare: one that is up, else one asked for now or before (a fork of a
        loaded server is nearer than a new interpreter would be); None only when the
        server cannot give one."""
        deadline = time.monotonic() + self.wait_s
        while True:
            self._collect(0)
            while self._ready:
                spare = self._ready.pop(0)
                if spare.poll() is None:
                    return spare
            if not self._pending:
                self.request(1)
            if not self._pending or self._proc is None or self._proc.poll() is not None:
                return None
            if not self._collect(deadline - time.monotonic()):
                # a server that owes spares and does not answer is stuck: never wait on
                # it again (the next request starts another)
                self._abandon()
                return None

    def assign(self, spare: Spare, job_dir: Path, key: bytes) -> bool:
        if self._proc is None or self._proc.stdin is None:
            return False
        try:
            self._proc.stdin.write(f"assign {spare.pid} {job_dir}\t{key.hex()}\n".encode())
            self._proc.stdin.flush()
        except OSError:
            return False
        return True

    def _collect(self, timeout: float) -> bool:
        """Read the server's answers (pid and start time of each new spare) that are in,
        waiting up to `timeout` for at least one. True if any came."""
        proc = self._proc
        if proc is None or not self._pending:
            return False
        got = False
        assert proc.stdout is not None  # started with stdout=PIPE
        fd = proc.stdout.fileno()
        while self._pending:
            readable, _, _ = select.select([fd], [], [], max(timeout, 0) if not got else 0)
            if not readable:
                break
            chunk = os.read(fd, 4096)
            if not chunk:  # the server is gone, and with it the answers it owed
                self._pending = 0
                break
            self._buffer += chunk
            while b"\n" in self._buffer and self._pending:
                line, self._buffer = self._buffer.split(b"\n", 1)
                pid, created = line.decode().split()
                self._ready.append(Spare(int(pid), float(created)))
                self._pending -= 1
                got = True
        return got

    def _end_server(self, grace_s: float) -> None:
        """Close the server's stdin: it exits on EOF, and its idle spares read EOF on
        theirs and exit too. One still there after `grace_s` is killed."""
        proc, self._proc = self._proc, None
        self._pending = 0
        if proc is None:
            return
        with contextlib.suppress(OSError, AttributeError):  # AttributeError: no pipe
            proc.stdin.close()  # type: ignore[union-attr]
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        with contextlib.suppress(OSError, AttributeError):
            proc.stdout.close()  # type: ignore[union-attr]

    def _abandon(self) -> None:
        """A server that owes spares and does not answer: it is not waited for again."""
        self._end_server(grace_s=0)

    def close(self) -> None:
        """The server ends; idle spares read EOF and exit. Spares with a job run on."""
        self._end_server(grace_s=5)
        for spare in self._ready:  # idle: they exit on EOF; make sure of it
            with contextlib.suppress(subprocess.TimeoutExpired):
                spare.wait(timeout=2)
            spare.kill()
        self._ready = []
