"""What the bounds, deputy and forged-curve attacks share: the two sandbox levels, a
candidate submitted and judged as an agent would, and the checks every attack ends with
(nothing forged kept, no secret anywhere a person or a proposer reads, the checkout
unchanged, no process left, the study goes on)."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import git, ratchet

from ratchet.core.candidate import Candidate
from ratchet.store.ledger import Ledger
from security.evidence import processes_in

LEVELS = ["bwrap", "pidns"]


def rows(repo: Path) -> list[Candidate]:
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        return ledger.candidates(confirmations=True)
    finally:
        ledger.close()


def incumbent(repo: Path) -> str:
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        return ledger.get("incumbent")
    finally:
        ledger.close()


def checkout(repo: Path) -> tuple[str, str, dict[str, bytes]]:
    """The user's checkout as they would compare it: HEAD, status and tracked files."""
    files = {p: (repo / p).read_bytes() for p in git(repo, "ls-files").splitlines()}
    return git(repo, "rev-parse", "HEAD"), git(repo, "status", "--porcelain"), files


def leftover_processes(repo: Path) -> list[str]:
    """Processes still working in the study's tree (cwd or command line in it), but this
    one."""
    return [f"{pid}: {what}" for pid, what in processes_in(repo.resolve()).items()]


def files_holding(repo: Path, secret: bytes) -> list[str]:
    """Every regular file under `repo` (links not followed) whose bytes hold `secret`."""
    found = []
    for root, _, names in os.walk(repo):
        for name in names:
            path = Path(root) / name
            if path.is_symlink() or not path.is_file():
                continue
            try:
                if secret in path.read_bytes():
                    found.append(str(path.relative_to(repo)))
            except OSError:
                continue
    return found


def assert_contained(repo: Path, before: tuple, env: dict[str, str],
                     secret: bytes | None = None) -> None:
    """The ends every attack is held to: the checkout unchanged, no process left behind,
    and (given a secret) the secret in no file of the study, no view a person reads
    (status, log, report, every candidate's logs) and so in no proposer's prompt."""
    assert checkout(repo) == before, "the user's checkout changed"
    assert leftover_processes(repo) == []
    if secret is None:
        return
    views = [ratchet(repo, "status", env=env), ratchet(repo, "report", env=env)]
    views += [ratchet(repo, "logs", c.id, env=env) for c in rows(repo)]
    for proc in views:
        assert secret.decode() not in proc.stdout + proc.stderr
    assert files_holding(repo, secret) == []
