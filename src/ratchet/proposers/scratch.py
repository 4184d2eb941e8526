"""A coding agent's throwaway copy of the incumbent, and what comes back from it.

An agent never works in the user's repository (not even a worktree of it: a worktree's
`.git` file points into the user's `.git`, and an agent that deletes it makes ratchet's
next git call run in the user's checkout). It gets a fresh private directory outside the
repository holding the incumbent's files and a git repository of its own, made before
the agent starts; ratchet never runs git there again. When the agent has ended, only the
regular files at editable paths are read back, without following links, and become the
proposal's new file contents, the same path an LLM's edits take. Tool and cache files
(`.aider.tags.cache.v4/`, `__pycache__/`, ...) are never read back.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ratchet.core import paths
from ratchet.job import gitrepo
from ratchet.proposers import agent_clis

# tool state, caches and byte code: never part of a change, whatever `editable` says
JUNK = agent_clis.JUNK
MAX_FILE_BYTES = 8 << 20  # an editable file larger than this is not read back
MAX_TOTAL_BYTES = 64 << 20
MAX_ENTRIES = 200_000  # files and directories looked at in one copy


@dataclass
class Harvest:
    """What an agent's copy holds, compared with the incumbent."""

    files: dict[str, bytes | None] = field(default_factory=dict)  # changed (None: deleted)
    problems: list[str] = field(default_factory=list)  # why it may not become a candidate
    ignored: list[str] = field(default_factory=list)  # changed outside the scope, not read


@dataclass
class Scratch:
    root: Path  # private (0700), outside the repository; removed by `remove`
    tree: Path  # the agent's working copy, root/work

    def remove(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def _git_env(home: Path) -> dict[str, str]:
    """git for the fresh copy: no system or global config, no hooks, no prompts."""
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home),
            "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0", "GIT_AUTHOR_NAME": "ratchet",
            "GIT_AUTHOR_EMAIL": "ratchet@localhost", "GIT_COMMITTER_NAME": "ratchet",
            "GIT_COMMITTER_EMAIL": "ratchet@localhost", "LC_ALL": "C"}


def agents_dir() -> Path:
    """Where agents' copies live: the user's cache, not /tmp, so that the sandbox can give
    each agent a private, empty /tmp (a CLI's own sandbox writes there) without hiding
    the agent's copy with it."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    where = base / "ratchet" / "agents"
    where.mkdir(parents=True, exist_ok=True, mode=0o700)
    return where


def make(repo: Path, commit: str, name: str, parent: Path | None = None) -> Scratch:
    """The incumbent's files in a fresh private directory with its own one-commit git."""
    try:
        parent = parent or agents_dir()
        root = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=parent))
    except OSError as exc:
        raise ScratchError(f"cannot make the agent's copy: {exc}") from None
    tree = root / "work"
    try:
        gitrepo.archive_to(repo, commit, tree)
        env = _git_env(root)
        for args in (["init", "-q", "-b", "main"], ["add", "-A"],
                     ["commit", "-q", "--no-verify", "-m", f"incumbent {commit[:12]}"]):
            subprocess.run(["git", "-c", "core.hooksPath=/dev/null", *args], cwd=tree,
                           env=env, check=True, capture_output=True, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.CalledProcessError, gitrepo.GitError) as exc:
        shutil.rmtree(root, ignore_errors=True)
        raise ScratchError(f"cannot make the agent's copy under {root.parent}: "
                           f"{_why(exc)}") from None
    return Scratch(root, tree)


class ScratchError(Exception):
    """The copy could not be made or read (disk full, ...): a fault, not a verdict."""


def _why(exc: BaseException) -> str:
    if isinstance(exc, subprocess.CalledProcessError) and exc.stderr:
        lines = exc.stderr.decode("utf-8", "replace").strip().splitlines()
        if lines:
            return lines[-1]
    return str(exc)


def blob_id(data: bytes, length: int) -> str:
    """git's id of a blob holding `data` (sha1, or sha256 in a sha256 repository)."""
    digest = hashlib.sha256 if length == 64 else hashlib.sha1
    return digest(b"blob %d\0" % len(data) + data).hexdigest()


# Variables naming a CLI's configuration directory, which the CLI also writes to as it runs.
# When the user names one in `[agent] env`, the agent gets a copy (top-level files only:
# config and credentials, not the sessions and logs beside them), never the directory.
CONFIG_DIRS = {"CODEX_HOME": ".codex", "CLAUDE_CONFIG_DIR": ".claude"}
CONFIG_FILE_BYTES = 1 << 20


def private_home(root: Path, env: Mapping[str, str]) -> dict[str, str]:
    """HOME, TMPDIR and named config directories for one agent, all under `root` (its
    copy's root, the only place it may write).

    The home is fresh, so the user's own dotfiles and logins stay out of the agent's
    reach; what it needs comes through the variables the user names. TMPDIR is a sibling
    of the home, not its parent: Codex will not create its helper binaries under the temp
    dir. Claude Code writes ~/.claude and ~/.claude.json, Codex $CODEX_HOME, aider its
    history and caches: all land here.
    """
    home, tmp = root / "home", root / "tmp"
    for d in (home, tmp):
        d.mkdir(mode=0o700, exist_ok=True)
    out = {"HOME": str(home), "TMPDIR": str(tmp)}
    for name, dotdir in CONFIG_DIRS.items():
        source = env.get(name)
        if source:
            out[name] = str(_copy_config(Path(source), home / dotdir))
    return out


def _copy_config(source: Path, target: Path) -> Path:
    target.mkdir(mode=0o700, parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        for entry in os.scandir(source):
            # regular files only, never through a link: the agent gets contents, not paths
            if entry.is_file(follow_symlinks=False) and \
                    entry.stat(follow_symlinks=False).st_size <= CONFIG_FILE_BYTES:
                shutil.copyfile(entry.path, target / entry.name, follow_symlinks=False)
    return target


def keep_path_in_login_shells(home: Path, path: str) -> None:
    """The agent's own HOME has no shell profile, and a login shell (Codex runs its
    commands with `bash -lc`) would reset PATH from /etc/profile, losing the Python and
    tools the agent was given: its profile sets PATH back."""
    line = f"export PATH={shlex.quote(path)}\n"
    for name in (".profile", ".zprofile"):
        (home / name).write_text(line)


def incumbent_listing(repo: Path, commit: str) -> dict[str, tuple[str, str]]:
    """path -> (git mode, blob id) of every file in `commit`."""
    out = gitrepo.git_bytes(repo, "ls-tree", "-r", "-z", commit).decode("utf-8", "replace")
    listing = {}
    for entry in out.split("\0"):
        meta, _, path = entry.partition("\t")
        fields = meta.split()
        if path and len(fields) == 3 and fields[1] == "blob":
            listing[path] = (fields[0], fields[2])
    return listing


def harvest(repo: Path, commit: str, tree: Path, editable: list[str],
            protected: list[str]) -> Harvest:
    """The editable files' new contents in `tree`, the agent's copy of `commit`.

    The agent has ended (its whole process tree is gone), so nothing changes under us;
    even so every file is opened without following links and checked to be a regular
    file after opening.
    """
    out = Harvest()
    listing = incumbent_listing(repo, commit)
    scoped = {p: meta for p, meta in listing.items()
              if (paths.matches_any(p, editable) or paths.protected_by(p, protected))
              and not JUNK.search(p)}
    old = dict(zip(scoped, gitrepo.blobs(repo, [blob for _, blob in scoped.values()]),
                   strict=True))
    found: set[str] = set()
    total = 0
    for rel in _walk(tree, out):
        if JUNK.search(rel):
            continue
        is_protected = paths.protected_by(rel, protected)
        if not is_protected and not paths.matches_any(rel, editable):
            if rel not in listing:
                continue  # a new file outside the scope (notes, build output): not read
            out.ignored.append(rel)  # tracked, not editable: compared below, never read
            continue
        found.add(rel)
        content = _read(tree, rel, out)
        if content is None:
            continue
        total += len(content)
        if total > MAX_TOTAL_BYTES:
            out.problems.append(f"the editable files passed {MAX_TOTAL_BYTES >> 20} MiB in "
                                "all; not read back")
            return out
        if old.get(rel) == content:
            continue
        if is_protected:
            out.problems.append(f"touches protected path {rel}")
            continue
        why = paths.unsafe(rel)
        if why:
            out.problems.append(f"path {rel!r} {why}")
            continue
        out.files[rel] = content
    for rel in scoped:
        if rel not in found:
            if paths.protected_by(rel, protected):
                out.problems.append(f"touches protected path {rel} (deleted it)")
            else:
                out.files[rel] = None  # the agent deleted an editable file
    out.ignored = _changed_tracked(tree, out.ignored, listing)
    return out


def _walk(tree: Path, out: Harvest):
    """Relative paths of everything but directories under `tree`; links are not followed,
    the agent's own `.git` is skipped."""
    seen = 0
    for top, dirs, files in os.walk(tree, followlinks=False):
        rel_top = os.path.relpath(top, tree)
        rel_top = "" if rel_top == "." else rel_top + "/"
        dirs[:] = sorted(d for d in dirs if d.lower() != ".git"
                         and not os.path.islink(os.path.join(top, d))
                         and not JUNK.search(rel_top + d))
        for name in sorted(files) + [d for d in os.listdir(top)
                                     if os.path.islink(os.path.join(top, d))
                                     and os.path.isdir(os.path.join(top, d))]:
            seen += 1
            if seen > MAX_ENTRIES:
                out.problems.append(f"the agent's copy holds more than {MAX_ENTRIES} entries; "
                                    "the rest were not looked at")
                return
            if rel_top == "" and name.lower() == ".git":
                continue
            yield rel_top + name


def _read(tree: Path, rel: str, out: Harvest) -> bytes | None:
    """A regular file's content, or None with the problem noted."""
    path = tree / rel
    try:
        info = os.lstat(path)
    except OSError as exc:
        out.problems.append(f"cannot read {rel}: {exc.strerror}")
        return None
    if stat.S_ISLNK(info.st_mode):
        out.problems.append(f"{rel} is a symlink (not allowed in candidates)")
        return None
    if not stat.S_ISREG(info.st_mode):
        out.problems.append(f"{rel} is not a regular file")
        return None
    if info.st_size > MAX_FILE_BYTES:
        out.problems.append(f"{rel} is larger than {MAX_FILE_BYTES >> 20} MiB")
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        out.problems.append(f"cannot read {rel}: {exc.strerror}")
        return None
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            out.problems.append(f"{rel} is not a regular file")
            return None
        return fh.read(MAX_FILE_BYTES + 1)[:MAX_FILE_BYTES + 1]


def _changed_tracked(tree: Path, candidates: list[str],
                     listing: dict[str, tuple[str, str]]) -> list[str]:
    """Which of these tracked, non-editable files the agent changed (for the record;
    their contents never come back). Compared by size first, then by git's blob id."""
    changed = []
    for rel in candidates[:1000]:
        with contextlib.suppress(OSError):
            info = os.lstat(tree / rel)
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_FILE_BYTES:
                changed.append(rel)
                continue
            data = (tree / rel).read_bytes()
            if blob_id(data, len(listing[rel][1])) != listing[rel][1]:
                changed.append(rel)
    return changed[:50]
