"""Faults of the machine, not of a candidate: one line naming the cause and the fix.

A full disk, a read-only `.git`, a ledger another process holds locked or a corrupted
one are never a candidate's verdict: the study stops with a line saying what to fix, and
the work it was doing is left pending, to resume with `ratchet run`.
"""

from __future__ import annotations

import errno
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from ratchet.core.errors import InfrastructureError

LEDGER = ".ratchet/ledger.db"
RESUME = "then run the same command again (the study resumes where it stopped)"
MIN_FREE_BYTES = 1 << 20


class InfraFault(InfrastructureError):
    """The machine, not the candidate, failed; the message names the cause and the fix
    (one kind of the one infrastructure error, core.errors.InfrastructureError)."""


def cause_of(text: str) -> str | None:
    """A known infrastructure cause in an error text (git's stderr, an OSError)."""
    lowered = text.lower()
    if "no space left" in lowered or "disk quota" in lowered:
        return "the disk is full"
    if "read-only file system" in lowered:
        return "the file system is read-only"
    if "permission denied" in lowered or "unable to create temporary file" in lowered or \
            "insufficient permission" in lowered:
        return "ratchet may not write there (permission denied)"
    return None


def git_fault(where: str, message: str) -> InfraFault | None:
    """An InfraFault for a failed git write, when its message shows a machine fault."""
    cause = cause_of(message)
    if cause is None:
        return None
    return InfraFault(f"cannot write to {where}: {cause} ({message.strip()[:160]}); free "
                      f"space or make it writable, {RESUME}")


def probe_writable(directory: Path, what: str) -> InfraFault | None:
    """Why ratchet cannot write in `directory` (read-only, full, not permitted), if it
    cannot: asked when a write there failed with a message that does not say (git's
    "Unable to add (null) to database")."""
    try:
        if shutil.disk_usage(directory).free < MIN_FREE_BYTES:
            return InfraFault(f"cannot write to {what}: the disk is full; free space, "
                              f"{RESUME}")
        fd, name = tempfile.mkstemp(dir=directory, prefix=".ratchet-probe-")
        os.close(fd)
        os.unlink(name)
    except OSError as exc:
        return os_fault(exc, what)
    return None


def os_fault(exc: OSError, where: str) -> InfraFault:
    names = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
             errno.EROFS: "the file system is read-only",
             errno.EACCES: "permission denied", errno.EPERM: "permission denied"}
    cause = names.get(exc.errno or 0, exc.strerror or str(exc))
    return InfraFault(f"cannot write to {where}: {cause}; free space or make it writable, "
                      f"{RESUME}")


def ledger_fault(exc: sqlite3.Error) -> InfraFault:
    text = str(exc).lower()
    if "locked" in text or "busy" in text:
        return InfraFault(f"the ledger {LEDGER} is locked by another process (it held it "
                          f"longer than 30 s); stop that process (`fuser {LEDGER}` names "
                          f"it), {RESUME}")
    if "malformed" in text or "not a database" in text or "corrupt" in text:
        return InfraFault(f"the ledger {LEDGER} is corrupted ({exc}); restore it from a "
                          f"backup, or move it away to start the study afresh "
                          f"(mv {LEDGER} {LEDGER}.broken)")
    if "readonly" in text or "read-only" in text:
        return InfraFault(f"the ledger {LEDGER} is read-only; make .ratchet/ writable, "
                          f"{RESUME}")
    if "disk" in text and "full" in text:
        return InfraFault(f"the disk holding {LEDGER} is full; free space, {RESUME}")
    return InfraFault(f"the ledger {LEDGER} failed: {exc}; {RESUME}")


FAULT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)


def as_fault(exc: BaseException) -> InfraFault | None:
    """The machine fault behind an error that escaped a command, if it is one."""
    if isinstance(exc, sqlite3.Error):
        return ledger_fault(exc)
    if isinstance(exc, OSError) and exc.errno in FAULT_ERRNOS:
        return os_fault(exc, str(exc.filename or "a file"))
    return None
