"""What the untrusted phases left in the job's tree that a trusted phase must never meet.

The evaluator and the hold-out run with more rights than the candidate's own phases, in
the tree those phases just wrote. Anything there that leads out of the tree would let the
trusted side act for the candidate: a symlink to a file the candidate cannot read (the
evaluator prints it in its error, and the reason carries it to the ledger, a prompt and
the dashboard), a fifo that blocks it, a socket or device it would talk to, a hard link
that makes a write in the tree a write elsewhere. The worker refuses all of these before
any trusted phase runs; the candidate is rejected with the paths named.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

NAMED = 10  # paths named in a reason; the rest are counted


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r + os.sep) for r in roots)


def walk(top: str) -> Iterator[os.DirEntry[str]]:
    """Every entry under `top`, symlinked directories not entered (scandir: the kind of
    each entry comes with its name, so only what needs a closer look costs a stat)."""
    todo = [top]
    while todo:
        try:
            with os.scandir(todo.pop()) as found:
                for entry in found:
                    yield entry
                    if entry.is_dir(follow_symlinks=False):
                        todo.append(entry.path)
        except OSError:
            continue


def symlinks(root: Path) -> dict[str, str]:
    """The symlinks under `root` as checked out, by path: those of the study's own commit
    (a candidate's commit may add or change none: driver.candidate refuses it)."""
    return {entry.path: os.readlink(entry.path) for entry in walk(str(root))
            if entry.is_symlink()}


def refused(roots: Sequence[Path], committed: Mapping[str, str] | None = None) -> list[str]:
    """One line per refused entry under `roots`, its path relative to its root.

    Refused: symlinks whose target (fully resolved) is outside every root, but those
    `committed` as they are (path -> target, from `symlinks` before any phase ran), fifos,
    sockets, character and block devices, and regular files with hard links outside the
    roots (more links than the walk found inside them). Nothing is opened or followed.
    """
    committed = committed or {}
    real_roots = [os.path.realpath(r) for r in roots]
    found: list[str] = []
    links: dict[tuple[int, int], tuple[int, str, int]] = {}  # inode -> (seen, path, nlink)
    for top in map(str, roots):
        for entry in walk(top):
            try:
                if entry.is_dir(follow_symlinks=False):
                    continue
                if entry.is_symlink():
                    kept = committed.get(entry.path) == os.readlink(entry.path)
                    if not kept and not _inside(os.path.realpath(entry.path), real_roots):
                        found.append(f"{os.path.relpath(entry.path, top)} (a symlink out of "
                                     "the job's tree)")
                    continue
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            mode = st.st_mode
            kind = ("a fifo" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode)
                    else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else None)
            if kind:
                found.append(f"{os.path.relpath(entry.path, top)} ({kind})")
            elif st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                seen, first, nlink = links.get(key, (0, os.path.relpath(entry.path, top),
                                                     st.st_nlink))
                links[key] = (seen + 1, first, nlink)
    found += [f"{first} (a hard link to a file outside the job's tree)"
              for seen, first, nlink in links.values() if seen < nlink]
    return found


def reason(found: Sequence[str], before: str) -> str:
    named = "; ".join(found[:NAMED])
    more = f"; and {len(found) - NAMED} more" if len(found) > NAMED else ""
    return (f"before {before}: the candidate's phases left what a trusted phase must not "
            f"follow: {named}{more}")
