"""What an attack left behind, as a user would look for it: the checkout, files, processes."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from helpers import git


def checkout_state(repo: Path) -> str:
    """What the user sees of the checkout: its status, ratchet's own outputs aside."""
    lines = git(repo, "status", "--porcelain", "--untracked-files=all").splitlines()
    return "\n".join(line for line in lines
                     if not line[3:].startswith((".ratchet/", "results.tsv", "progress")))


def files_holding(root: Path, text: str) -> list[Path]:
    """Every file under `root` (the ledger, logs, results) that holds `text`."""
    needle = text.encode()
    return [p for p in root.rglob("*") if p.is_file() and not p.is_symlink()
            and needle in p.read_bytes()]


def processes_in(root: Path) -> dict[int, str]:
    """Processes still running whose working directory or command line is in `root`."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if int(pid) != os.getpid() and (cwd.startswith(str(root)) or str(root) in cmd):
            found[int(pid)] = f"{cmd[:160]} (in {cwd})"
    return found


def end_processes_in(root: Path) -> None:
    """Kill, by pid, what an attack that got in left running in `root` (a failing test
    must not leave work on a shared machine)."""
    for pid in processes_in(root):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
