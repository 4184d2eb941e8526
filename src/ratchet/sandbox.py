"""Sandbox for candidate phases, as far as the OS allows one.

Three levels, best first, decided once per machine:
- `bwrap` (Debian package `bubblewrap`): the whole filesystem is read-only but the job's
  own directories, the hold-out directory is hidden behind an empty tmpfs for everything
  but the trusted evaluator, and the phase gets its own PID namespace.
- `pidns` (util-linux `unshare`, no bubblewrap): the phase gets its own PID namespace
  (as root, or through an unprivileged user namespace where the kernel allows it), so a
  candidate sees only its own processes: not the driver, not other jobs, not their
  `/proc/<pid>/environ`. Files are guarded by detect-and-reject (hashes after each phase).
- `none`: nothing isolates; `ratchet status` says so.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

BWRAP = "bwrap"
PIDNS = "pidns"
NONE = "none"


def _probe(argv: list[str], expect: str = "1") -> bool:
    try:
        probe = subprocess.run(argv, capture_output=True, timeout=10, text=True,
                               stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and probe.stdout.strip() == expect


@functools.cache
def _bwrap_modes() -> tuple[bool, bool]:
    """(bubblewrap works, it can also give a PID namespace)."""
    exe = shutil.which("bwrap")
    if not exe:
        return False, False
    base = [exe, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
    if _probe([*base, "--unshare-pid", "/bin/sh", "-c", "echo 1"]):
        return True, True
    return _probe([*base, "/bin/sh", "-c", "echo 1"]), False


def bwrap_works() -> bool:
    return _bwrap_modes()[0]


@functools.cache
def unshare_prefix() -> tuple[str, ...] | None:
    """The util-linux `unshare` command line that gives a new PID namespace here, if any.

    `--kill-child`: if `unshare` dies, its child (PID 1 of the namespace, and with it the
    whole namespace) is killed too, so a timeout never leaves candidate processes behind.
    """
    exe = shutil.which("unshare")
    if not exe:
        return None
    tail = ["--pid", "--fork", "--mount-proc", "--kill-child"]
    choices = []
    if os.geteuid() == 0:
        choices.append([exe, *tail])
    choices += [[exe, "--user", "--map-current-user", *tail],
                [exe, "--user", "--map-root-user", *tail]]
    for prefix in choices:
        if _probe([*prefix, "/bin/sh", "-c", "echo $$"]):
            return tuple(prefix)
    return None


def choose(preference: str) -> str:
    """`auto`: the best level available; `bwrap`: bubblewrap or an error; `none`: nothing."""
    if preference == NONE:
        return NONE
    if preference in ("auto", BWRAP) and bwrap_works():
        return BWRAP
    if preference == BWRAP:
        raise RuntimeError("sandbox = 'bwrap' was asked for but bubblewrap does not work here")
    if unshare_prefix() is not None:  # auto, or pidns decided on another machine
        return PIDNS
    return NONE


def describe(preference: str = "auto") -> str:
    try:
        kind = choose(preference)
    except RuntimeError as exc:
        return f"unavailable: {exc}"
    if kind == BWRAP and _bwrap_modes()[1]:
        return "bwrap (read-only filesystem except the job's directory; own PID namespace)"
    if kind == BWRAP:
        return ("bwrap (read-only filesystem except the job's directory); NO PID namespace: "
                "candidates can see other processes of this user")
    if kind == PIDNS:
        return ("pid namespace only (unshare): candidates see only their own processes; "
                "no bubblewrap, so files are guarded by detect-and-reject (hash checks)")
    if preference == NONE:
        return ("none (sandbox = \"none\"): candidates can see every process of this user, "
                "and read their environments; files guarded by detect-and-reject")
    return ("none: NO ISOLATION: neither bubblewrap nor a PID namespace (unshare) works "
            "here; candidates can see every process of this user and read their "
            "environments; files guarded by detect-and-reject (hash checks)")


def wrap(
    kind: str,
    argv: list[str],
    *,
    writable: list[Path],
    hidden: list[str] | None = None,
    readonly: list[str] | None = None,
) -> list[str]:
    if kind == PIDNS:
        prefix = unshare_prefix()
        return [*prefix, *argv] if prefix else argv
    if kind != BWRAP:
        return argv
    exe = shutil.which("bwrap") or "bwrap"
    # /dev is bound whole so GPUs (/dev/nvidia*) stay reachable; /proc is fresh and, with
    # its own PID namespace, shows the phase's processes alone.
    args = [exe, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
    if _bwrap_modes()[1]:
        args.append("--unshare-pid")
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
