"""Can a party's uid reach what it needs? One probe, asked by whoever is about to blame it.

As root, every untrusted party runs as an unprivileged uid of its own (`sandbox`). That
uid must be able to start the interpreter and read the venv, the job's tree and the
prepared data. bubblewrap and the `unshare` level open a private parent (a 0700
`mktemp -d`, a home other than /root) by binding what the party needs at the same path
(`sandbox.private_ancestors`); what they cannot open is a path that is itself closed to
others (a venv or checkout made under `umask 077`), or any private parent at level
`none`, where there is no mount namespace.

`probe` starts a party exactly as a job would (same level, same policy, same uid), with
the interpreter and the paths to read, and returns one line naming the first path that
uid cannot reach, the directory in the way and the fix, or None. It is asked

- by the driver before the first job (`ratchet run` / `submit` refuse, nothing recorded);
- by the worker and the evaluator when a party died at its start (exit 126 with the
  warden's "cannot start"), before the failure is put on the candidate: a party the
  sandbox cannot start is the machine's fault, never the candidate's. The candidate
  cannot answer for the probe: it runs in a fresh sandbox with no candidate code, and
  checks only paths the candidate cannot write.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from ratchet.job import sandbox

# The warden's words when it could not exec the party (`warden._child`)
START_FAILED = "ratchet sandbox: cannot start "
PROBE_TIMEOUT_S = 60.0

# Run as the party (python -I -S: no site, so a closed site-packages is reported, not
# crashed on). Prints `path<TAB>in the way<TAB>search|read` for the first problem.
_PROBE = r"""
import os, sys
def first_closed(path):
    parts = path.split("/")
    for i in range(2, len(parts)):
        up = "/".join(parts[:i])
        if not os.access(up, os.X_OK):
            return up
    return None
def report(path, where, kind):
    print(f"{path}\t{where}\t{kind}")
    sys.exit(3)
for arg in sys.argv[1:]:
    only_reach, path = arg.startswith("@"), arg.lstrip("@")
    where = first_closed(path)
    if where:
        report(path, where, "search")
    if not os.path.lexists(path):
        report(path, path, "missing")
    if only_reach:
        continue
    if os.path.isdir(path):
        if not os.access(path, os.R_OK | os.X_OK):
            report(path, path, "read")
        for name in sorted(os.listdir(path)):
            entry = os.path.join(path, name)
            wanted = os.R_OK | (os.X_OK if os.path.isdir(entry) else 0)
            if os.path.exists(entry) and not os.access(entry, wanted):
                report(entry, entry, "read")
    elif not os.access(path, os.R_OK):
        report(path, path, "read")
"""


def needed(python: str | None = None, extra: Iterable[Path | str] = ()) -> list[Path]:
    """What any party of ours reads: the interpreter, its prefix, stdlib and
    site-packages (and ratchet's own package, which the candidate child runs from)."""
    exe = Path(python or sys.executable)
    paths = [exe, Path(os.path.realpath(exe)), Path(sys.prefix),
             Path(os.path.dirname(os.__file__)), Path(sandbox.__file__).parents[1]]
    paths += [Path(p) for p in sys.path if p and p.endswith("-packages") and Path(p).is_dir()]
    paths += [Path(p) for p in extra]
    seen: dict[Path, None] = {}
    for path in paths:
        path = Path(os.path.abspath(path))
        if path.exists():
            seen.setdefault(path, None)
    return list(seen)


def probe(level: sandbox.Level | str, policy: sandbox.Policy, paths: Sequence[Path],
          who: str, env: Mapping[str, str] | None = None, cwd: Path | None = None,
          trees: Sequence[Path] = ()) -> str | None:
    """None when `who` (its uid under `policy`) can read every path of `paths` (and the
    entries of a directory) and reach each of `trees`, else the one line that says which
    path it cannot, what is in the way and the fix. `trees`: the job's work tree and the
    like, which the candidate writes: only the way to them is checked, never what is in
    them (a file the candidate closed must not make its failure the machine's)."""
    uid = policy.party_uid()
    if uid is None and sandbox.Level(level) == sandbox.Level.NONE:
        return None  # it runs as the caller, in the caller's view: it reaches what we do
    # as the caller's uid but in a view of its own (an evaluator that is not root starts
    # its child so): what the view hides, it cannot reach
    uid = os.geteuid() if uid is None else uid
    argv = sandbox.command(level, [sys.executable, "-I", "-S", "-c", _PROBE,
                                   *map(str, paths), *(f"@{t}" for t in trees)], policy)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              stdin=subprocess.DEVNULL, cwd=cwd or "/",
                              env=dict(env) if env is not None else {"PATH": os.defpath})
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"ratchet sandbox: cannot start {who} as uid {uid}: {exc}"
    if done.returncode == 0:
        return None
    fields = (done.stdout.strip().splitlines() or [""])[-1].split("\t")
    if done.returncode == 3 and len(fields) == 3:
        return line(who, uid, Path(fields[0]), Path(fields[1]), fields[2])
    if START_FAILED in done.stderr:  # the interpreter itself: found on this side
        exe = Path(sys.executable)
        opened = _opened(level, policy, uid)
        closed = closed_on_the_way(exe, uid, opened)
        return line(who, uid, exe, closed or exe, "search" if closed else "read")
    tail = " | ".join(done.stderr.strip().splitlines()[-2:])[:300]
    return (f"ratchet sandbox: cannot start {who} as uid {uid} "
            f"(exit {done.returncode}): {tail or 'no message'}")


def _opened(level: sandbox.Level | str, policy: sandbox.Policy, uid: int) -> set[Path]:
    """The paths the sandbox puts back inside the private directories it opens: the
    directories above them are made searchable, they keep their own modes."""
    if sandbox.Level(level) == sandbox.Level.NONE:
        return set()
    return {p for keep in sandbox.private_cover(policy, uid).values() for p in keep}


def closed_on_the_way(path: Path, uid: int, opened: Iterable[Path] = ()) -> Path | None:
    """The first directory above `path` that `uid` may not search in the party's view.
    Above the deepest path the sandbox put back (`opened`) it made every directory
    searchable; from that path down, the real modes count."""
    chain = Path(os.path.abspath(path)).parents[::-1][1:]  # outermost first, "/" left out
    kept = [i for i, p in enumerate(chain) if p in set(opened)]
    return next((p for p in chain[kept[-1] if kept else 0:] if not _searchable(p, uid)), None)


def _searchable(path: Path, uid: int) -> bool:
    try:
        st = path.stat()
    except OSError:
        return False
    bit = stat.S_IXUSR if st.st_uid == uid else stat.S_IXOTH
    return bool(st.st_mode & bit)


def line(who: str, uid: int, path: Path, where: Path, kind: str) -> str:
    """The one line: which uid, which path, what is in the way, and the fixes."""
    try:
        st = where.stat()
        what = f"{where} is mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid}"
    except OSError:
        what = f"{where} cannot be read"
    venv = Path(sys.prefix)
    if kind == "missing":
        fix = f"make {where} visible to the sandbox"
    elif where == venv or venv in where.parents:  # a venv made under umask 077
        fix = f"`chmod -R o+rX {venv}`"
    elif kind == "search":
        fix = f"`chmod o+x {where}`"
    else:
        fix = f"`chmod -R o+rX {where}`"
    return (f"ratchet sandbox: uid {uid}, which runs {who}, cannot "
            f"{'reach' if kind == 'search' else 'read'} {path} ({what}); fix: {fix}, or "
            "move the checkout and its venv under a directory others may enter and read, "
            "or run ratchet as a user other than root (no uid is then dropped)")


def start_failed(output: str) -> bool:
    """Did a party die at its start, as the warden says when it cannot exec it (its
    first words)? Not its exit status: a sandbox killed right after (the evaluator kills
    a dead child's whole tree) reports the kill. The candidate could print the same:
    only a failed `probe` makes it the machine's fault."""
    return output.lstrip().startswith(START_FAILED)
