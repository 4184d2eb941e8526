"""Starting a study over without losing the old one (`ratchet reset`).

The old study's record is moved, never deleted or overwritten: its ledger and job
directories go to `.ratchet/archive/<study>-<UTC time>/`, its views (results.tsv,
progress.png) with them, and its refs (`refs/ratchet/<study>/...` and the study branch)
to `refs/ratchet-archive/<study>-<UTC time>/...`. The next `ratchet run` then starts a
fresh study from HEAD. The study lock is held throughout: a running driver is never
pulled from under.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ratchet.core.config import CONFIG_FILE
from ratchet.core.errors import UserError
from ratchet.core.vocab import Kind, Status
from ratchet.driver.candidate import study_branch
from ratchet.driver.config import loads_config
from ratchet.driver.lock import StudyLock
from ratchet.job import gitrepo
from ratchet.store.ledger import Ledger, LedgerError

STATE_DIR = ".ratchet"  # study.STATE_DIR (not imported: the study front is heavy)
ARCHIVE = "archive"
ARCHIVE_REFS = "refs/ratchet-archive"
# what stays in .ratchet: the locks (held now, or by a submission), earlier archives, and
# what any study may reuse (prepared data and build caches are keyed by their inputs; slot
# locks are the machine's, not the study's)
KEEP = frozenset({"lock", "submit.lock", ARCHIVE, "cache", "slots"})
VIEWS = ("results.tsv", "progress.png")  # the old study's views, beside the repository


class ResetError(UserError):
    pass


@dataclass(frozen=True)
class Archived:
    name: str  # <study>-<UTC time>
    directory: Path  # .ratchet/archive/<name>
    refs: int  # how many refs were moved under refs/ratchet-archive/<name>/

    def line(self) -> str:
        return (f"archived the study as {self.directory} and {self.refs} ref(s) under "
                f"{ARCHIVE_REFS}/{self.name}/; the next `ratchet run` starts a fresh study")


def reset_study(repo: Path) -> Archived:
    """Archive the study of `repo` (a work tree's top); refuses while a driver holds it."""
    state = repo / STATE_DIR
    if not (state / "ledger.db").exists():
        raise ResetError(f"{repo}: no study to reset ({STATE_DIR}/ledger.db does not exist)")
    lock = StudyLock(state / "lock")
    lock.acquire()  # StudyLocked: a driver is running it
    try:
        return _archive(repo, state)
    finally:
        lock.release()


def _archive(repo: Path, state: Path) -> Archived:
    ledger = _open(state / "ledger.db")
    try:
        study = ledger.study().study or _config_name(repo)
    finally:
        ledger.close()
    branch = study_branch(study)
    head_ref = gitrepo.git(repo, "symbolic-ref", "-q", "HEAD") if _on_branch(repo) else ""
    if head_ref == branch:
        raise ResetError(f"the study branch {branch.removeprefix('refs/heads/')} is checked "
                         "out; check out another branch (git switch main), then reset")
    name, directory = _fresh_name(state / ARCHIVE, study)
    refs = _refs(repo, study, branch)
    # the refs first, in one transaction: each is created under the archive (never over an
    # existing one) and deleted where it was only if it still names the same commit
    lines = []
    for ref, sha in refs:
        target = f"{ARCHIVE_REFS}/{name}/" + (
            "branch" if ref == branch else ref.removeprefix(f"refs/ratchet/{study}/"))
        lines += [f"create {target} {sha}", f"delete {ref} {sha}"]
    if lines:
        script = "start\n" + "\n".join(lines) + "\nprepare\ncommit\n"
        gitrepo.git(repo, "update-ref", "--stdin", input=script.encode())
    directory.mkdir(parents=True)
    for entry in sorted(state.iterdir()):
        if entry.name not in KEEP:
            entry.rename(directory / entry.name)
    for view in VIEWS:
        if (repo / view).exists():
            (repo / view).rename(directory / view)
    return Archived(name=name, directory=directory, refs=len(refs))


def _open(db: Path) -> Ledger:
    try:
        return Ledger(db)
    except LedgerError as exc:  # unreadable or from a newer ratchet: one line, no traceback
        raise ResetError(str(exc)) from None


def _config_name(repo: Path) -> str:
    try:
        return loads_config((repo / CONFIG_FILE).read_bytes(), CONFIG_FILE).task.name
    except OSError:
        raise ResetError(f"{repo}: the ledger names no study and {CONFIG_FILE} is "
                         "missing") from None


def _on_branch(repo: Path) -> bool:
    try:
        gitrepo.git(repo, "symbolic-ref", "-q", "HEAD")
    except gitrepo.GitError:
        return False  # a detached HEAD
    return True


def _fresh_name(archive: Path, study: str) -> tuple[str, Path]:
    """A name no archive has (two resets in one second get -2, -3, ...)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    name, n = f"{study}-{stamp}", 1
    while (archive / name).exists():
        n += 1
        name = f"{study}-{stamp}-{n}"
    return name, archive / name


def _refs(repo: Path, study: str, branch: str) -> list[tuple[str, str]]:
    out = gitrepo.git(repo, "for-each-ref", "--format=%(refname) %(objectname)",
                      f"refs/ratchet/{study}/", branch)
    return [(ref, sha) for ref, _, sha in (line.partition(" ") for line in out.splitlines())
            if ref]


def unjudged_config_change(repo: Path, ledger: Ledger) -> str | None:
    """The commit whose ratchet.toml a study that judged no candidate yet should take:
    HEAD, when its committed ratchet.toml differs from the one pinned at the study's
    start (else None). Once a candidate is judged against a measured baseline, the pinned
    config stays; a study whose baseline failed compared nothing, whatever it judged."""
    pinned = ledger.study().config
    cands = ledger.candidates()
    if any(c.kind == Kind.BASELINE and c.status in (Status.CRASH, Status.REJECTED)
           for c in cands):
        cands = []  # its verdicts are all "crash" or "rejected" against no baseline
    if not pinned or any(c.kind == Kind.CANDIDATE and c.is_judged for c in cands):
        return None
    head = gitrepo.try_rev_parse(repo, "HEAD")
    if head is None or head == ledger.study().pinned or not gitrepo.path_exists(
            repo, head, CONFIG_FILE):
        return None
    committed = gitrepo.show(repo, head, CONFIG_FILE).decode("utf-8", "replace")
    return head if committed != pinned else None


def start_over_if_changed(repo: Path) -> str | None:
    """`ratchet run` before any candidate is judged: a committed change to ratchet.toml
    is taken by starting the study over from HEAD (the old one archived). Returns the
    line that says so, or None when the study goes on as pinned."""
    if not (repo / STATE_DIR / "ledger.db").exists():
        return None
    ledger = _open(repo / STATE_DIR / "ledger.db")
    try:
        head = unjudged_config_change(repo, ledger)
        start = str(ledger.study().pinned or "")
    finally:
        ledger.close()
    if head is None:
        return None
    archived = reset_study(repo)
    return (f"{CONFIG_FILE} changed in HEAD {head[:7]} since the study started at "
            f"{start[:7]} and no candidate was judged against a baseline yet: the study "
            f"starts over with it "
            f"(the old one is archived as {archived.directory} and "
            f"{ARCHIVE_REFS}/{archived.name}/)")
