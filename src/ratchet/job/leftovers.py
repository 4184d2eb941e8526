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
from collections.abc import Sequence
from pathlib import Path

NAMED = 10  # paths named in a reason; the rest are counted


def _inside(path: str, roots: Sequence[str]) -> bool:
    return any(path == r or path.startswith(r + os.sep) for r in roots)


def refused(roots: Sequence[Path]) -> list[str]:
    """One line per refused entry under `roots`, its path relative to its root.

    Refused: symlinks whose target (fully resolved) is outside every root, fifos, sockets,
    character and block devices, and regular files with hard links outside the roots
    (more links than the walk found inside them). Nothing is opened or followed.
    """
    real_roots = [os.path.realpath(r) for r in roots]
    found: list[str] = []
    links: dict[tuple[int, int], tuple[int, str, int]] = {}  # inode -> (seen, name, nlink)
    for top in roots:
        for root, dirs, files in os.walk(top):  # never follows a symlinked directory
            for name in dirs + files:
                path = os.path.join(root, name)
                rel = os.path.relpath(path, top)
                try:
                    st = os.lstat(path)
                except OSError:
                    continue
                mode = st.st_mode
                if stat.S_ISLNK(mode):
                    target = os.path.realpath(path)
                    if not _inside(target, real_roots):
                        found.append(f"{rel} (a symlink out of the job's tree)")
                elif stat.S_ISFIFO(mode):
                    found.append(f"{rel} (a fifo)")
                elif stat.S_ISSOCK(mode):
                    found.append(f"{rel} (a socket)")
                elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
                    found.append(f"{rel} (a device)")
                elif stat.S_ISREG(mode) and st.st_nlink > 1:
                    key = (st.st_dev, st.st_ino)
                    seen, first, nlink = links.get(key, (0, rel, st.st_nlink))
                    links[key] = (seen + 1, first, nlink)
    found += [f"{first} (a hard link to a file outside the job's tree)"
              for seen, first, nlink in links.values() if seen < nlink]
    return found


def reason(found: Sequence[str], before: str) -> str:
    named = "; ".join(found[:NAMED])
    more = f"; and {len(found) - NAMED} more" if len(found) > NAMED else ""
    return (f"before {before}: the candidate's phases left what a trusted phase must not "
            f"follow: {named}{more}")
