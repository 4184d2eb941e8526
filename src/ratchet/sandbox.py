"""Filesystem sandbox for candidate phases, where the OS allows one.

With bubblewrap (Debian package `bubblewrap`) the whole filesystem is mounted
read-only and only the job's own directories are writable: a candidate cannot move a
ref in the repository's .git, edit the ledger, the prepared data or another candidate.
The hold-out directory is hidden behind an empty tmpfs for everything but the trusted
evaluator. Without bwrap ratchet falls back to detect-and-reject (hashes checked after
every phase) and `ratchet status` says so.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path


@functools.cache
def bwrap_works() -> bool:
    exe = shutil.which("bwrap")
    if not exe:
        return False
    try:
        probe = subprocess.run(
            [exe, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc", "true"],
            capture_output=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def choose(preference: str) -> str:
    if preference == "none":
        return "none"
    if preference in ("auto", "bwrap") and bwrap_works():
        return "bwrap"
    if preference == "bwrap":
        raise RuntimeError("sandbox = 'bwrap' was asked for but bubblewrap does not work here")
    return "none"


def describe() -> str:
    if bwrap_works():
        return "bwrap (read-only filesystem except the job's directory)"
    return "none: bubblewrap unavailable; falling back to detect-and-reject (hash checks)"


def wrap(
    kind: str,
    argv: list[str],
    *,
    writable: list[Path],
    hidden: list[str] | None = None,
    readonly: list[str] | None = None,
) -> list[str]:
    if kind != "bwrap":
        return argv
    exe = shutil.which("bwrap") or "bwrap"
    # /dev is bound whole so GPUs (/dev/nvidia*) stay reachable; /proc is fresh.
    args = [exe, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
    for shm in ("/dev/shm",):
        if Path(shm).is_dir():
            args += ["--tmpfs", shm]
    for path in writable:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        args += ["--bind", str(path), str(path)]
    for path in readonly or []:
        if Path(path).exists():
            args += ["--ro-bind", str(path), str(path)]
    for path in hidden or []:
        if Path(path).exists():
            args += ["--tmpfs", str(path)]
    args += ["--die-with-parent", "--"]
    return args + argv
