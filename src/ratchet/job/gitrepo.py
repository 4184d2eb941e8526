"""Thin, explicit git plumbing.

Candidates are built with plumbing (a private index file, `commit-tree`, `update-ref`)
so the user's checkout, index and working tree are never touched.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from ratchet.core.errors import UserError

# A full commit id names the same files forever, so what `show` and `ls-tree` read at
# one is kept (in this process only) instead of asking git again: a round of proposals
# reads the same knob file once, not once per proposal.
_FULL_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
SHOW_CACHE_ENTRIES = 256
SHOW_CACHE_BYTES = 1 << 20  # larger files are read again when asked for


class GitError(UserError):
    pass


def git(repo: Path, *args: str, input: bytes | None = None, env: dict | None = None,
        user_config: bool = False) -> str:
    out = git_bytes(repo, *args, input=input, env=env, user_config=user_config)
    return out.decode("utf-8", "replace").strip()


# Every git call ratchet makes runs no code from the repository's config or hooks: a
# proposer or candidate that got a hook, an fsmonitor or a signing program into a `.git`
# would otherwise run as the driver, with its secrets, on ratchet's next git call.
HARDENED = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false",
            "-c", "core.untrackedCache=false", "-c", "commit.gpgSign=false",
            "-c", "tag.gpgSign=false", "-c", "core.pager=cat", "-c", "protocol.ext.allow=never")
# What git needs of the driver's environment; everything else (API keys, tokens, GIT_DIR
# or GIT_CONFIG_* set by someone else) stays out.
_ENV_KEEP = ("PATH", "HOME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "SYSTEMROOT")


def git_env(extra: dict | None = None, *, user_config: bool = False) -> dict[str, str]:
    """A scrubbed environment for git: no secrets, no system or global config (unless
    `user_config`: the user's own identity for `ratchet export`), never a prompt."""
    env = {k: v for k, v in os.environ.items() if k in _ENV_KEEP or k.startswith("LC_")}
    env["GIT_TERMINAL_PROMPT"] = "0"
    if not user_config:
        env["GIT_CONFIG_NOSYSTEM"] = "1"
        env["GIT_CONFIG_GLOBAL"] = os.devnull
    env.update(extra or {})
    return env


def git_argv(repo: Path, *args: str) -> list[str]:
    """The command line of a hardened git call in `repo` (for callers that need Popen)."""
    return ["git", *HARDENED, "-C", str(repo), *args]


def git_bytes(repo: Path, *args: str, input: bytes | None = None, env: dict | None = None,
              user_config: bool = False) -> bytes:
    proc = subprocess.run(
        git_argv(repo, *args),
        input=input,
        capture_output=True,
        env=git_env(env, user_config=user_config),
    )
    if proc.returncode != 0:
        message = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(f"git {' '.join(args[:3])}: {message[-1] if message else 'failed'}")
    return proc.stdout


def work_tree(path: Path) -> Path | None:
    """The top of the work tree `path` is in, or None outside one (one git call)."""
    try:
        out = git(path, "rev-parse", "--is-inside-work-tree", "--show-toplevel").splitlines()
    except (GitError, FileNotFoundError):
        return None
    return Path(out[1]) if len(out) == 2 and out[0] == "true" else None


def rev_parse(repo: Path, rev: str) -> str:
    return git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")


def try_rev_parse(repo: Path, rev: str) -> str | None:
    try:
        return rev_parse(repo, rev)
    except GitError:
        return None


def path_exists(repo: Path, commit: str, path: str) -> bool:
    """Is `path` in `commit`'s tree (a file or a directory)?"""
    try:
        git(repo, "cat-file", "-e", f"{commit}:{path}")
    except GitError:
        return False
    return True


_shown: dict[tuple[str, str, str], bytes] = {}
_shown_lock = threading.Lock()


def show(repo: Path, commit: str, path: str) -> bytes:
    key = (str(repo), commit, path)
    cached = _shown.get(key)
    if cached is not None:
        return cached
    data = git_bytes(repo, "show", f"{commit}:{path}")
    if _FULL_ID.fullmatch(commit) and len(data) <= SHOW_CACHE_BYTES:
        with _shown_lock:
            if len(_shown) >= SHOW_CACHE_ENTRIES:
                _shown.pop(next(iter(_shown)))  # the oldest
            _shown[key] = data
    return data


def blobs(repo: Path, ids: list[str]) -> list[bytes]:
    """The contents of blobs by id, in order, from one `git cat-file --batch`."""
    if not ids:
        return []
    out = git_bytes(repo, "cat-file", "--batch", input="".join(f"{i}\n" for i in ids).encode())
    contents, at = [], 0
    for blob_id in ids:
        header_end = out.index(b"\n", at)
        header = out[at:header_end].split()
        if len(header) != 3 or header[1] != b"blob":
            raise GitError(f"git cat-file: {blob_id} is not a blob")
        size = int(header[2])
        contents.append(out[header_end + 1:header_end + 1 + size])
        at = header_end + 1 + size + 1  # the content is followed by a newline
    return contents


def update_ref(repo: Path, ref: str, new: str, old: str | None = None, reason: str = "") -> None:
    args = ["update-ref", "-m", reason or "ratchet", ref, new]
    if old is not None:
        args.append(old)
    git(repo, *args)


def is_dirty(repo: Path) -> bool:
    return bool(git(repo, "status", "--porcelain", "--untracked-files=no"))


def exclude_locally(repo: Path, patterns: list[str]) -> None:
    """Keep ratchet's own files out of `git status` without touching .gitignore."""
    exclude = _exclude_file(str(repo))
    exclude.parent.mkdir(parents=True, exist_ok=True)
    existing = exclude.read_text().splitlines() if exclude.exists() else []
    missing = [p for p in patterns if p not in existing]
    if missing:
        with exclude.open("a") as fh:
            fh.write("".join(f"{p}\n" for p in missing))


@functools.lru_cache(maxsize=64)
def _exclude_file(repo: str) -> Path:
    """Where `repo`'s info/exclude lives (asked of git once per repository and process:
    the views and the chart add to it at the end of every run)."""
    exclude = Path(git(Path(repo), "rev-parse", "--git-path", "info/exclude"))
    return exclude if exclude.is_absolute() else Path(repo) / exclude


@dataclass(frozen=True)
class Change:
    """One path changed between two commits, as `git diff --raw` reports it."""

    status: str  # A, M, D, T (type change)
    path: str
    old_mode: str
    new_mode: str


def diff_changes(repo: Path, base: str, head: str) -> list[Change]:
    # --no-renames: a rename is a delete plus an add, so both paths are checked.
    raw = git_bytes(repo, "diff", "--raw", "--no-renames", "-z", "--no-abbrev", base, head)
    fields = raw.decode("utf-8", "replace").split("\0")
    changes = []
    i = 0
    while i + 1 < len(fields):
        meta, path = fields[i], fields[i + 1]
        i += 2
        if not meta.startswith(":"):
            continue
        old_mode, new_mode, _, _, status = meta[1:].split()
        changes.append(Change(status[0], path, old_mode, new_mode))
    return changes


def diff_text(repo: Path, base: str, head: str) -> str:
    return git(repo, "diff", "--no-color", "--no-ext-diff", "--no-textconv", base, head)


DIFF_BATCH = 200  # pairs per `git diff-tree --stdin`: a process per batch, its output held


def diff_texts(repo: Path, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str | GitError]:
    """`diff_text` of many (base, head) commit pairs, one `git diff-tree --stdin` per
    DIFF_BATCH of them instead of a `git diff` each (a report of 10,000 candidates).
    A pair of full commit ids only; another pair, or a batch git refuses (a commit
    missing), is asked of `git diff` alone, so each failure stays its own GitError."""
    out: dict[tuple[str, str], str | GitError] = {}
    full = [p for p in dict.fromkeys(pairs) if _FULL_ID.fullmatch(p[0]) and _FULL_ID.fullmatch(p[1])]
    for at in range(0, len(full), DIFF_BATCH):
        out.update(_diff_batch(repo, full[at:at + DIFF_BATCH]))
    for base, head in pairs:
        if (base, head) not in out:
            try:
                out[base, head] = diff_text(repo, base, head)
            except GitError as exc:
                out[base, head] = exc
    return out


def _diff_batch(repo: Path, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """One diff-tree process: a line `HEAD BASE` each (HEAD compared with BASE as its
    parent), answered by HEAD's id on a line of its own, then the patch (none when the
    trees are equal: --always still names it). A patch line never is a bare commit id
    (each has its prefix: ' ', '+', '-', '@@', 'diff ', ...), so the answers split at
    the ids asked for, in order. -M: `git diff` finds renames by default, diff-tree not."""
    stdin = "".join(f"{head} {base}\n" for base, head in pairs).encode()
    try:
        raw = git_bytes(repo, "diff-tree", "--stdin", "-p", "-M", "--always", "--no-color",
                        input=stdin)
    except GitError:
        return {}  # each pair alone names its own fault
    lines = raw.decode("utf-8", "replace").split("\n")
    out: dict[tuple[str, str], str] = {}
    at = 0
    for i, (base, head) in enumerate(pairs):
        if at >= len(lines) or lines[at] != head:
            return out  # not the answer expected: the rest asked alone
        end = at + 1
        following = pairs[i + 1][1] if i + 1 < len(pairs) else None
        while end < len(lines) and lines[end] != following:
            end += 1
        out[base, head] = "\n".join(lines[at + 1:end]).strip()
        at = end
    return out


def commit_files(
    repo: Path,
    parent: str,
    files: dict[str, bytes | None],
    message: str,
) -> str:
    """A new commit = parent's tree with `files` replaced (None deletes). No checkout."""
    if files and all("/" not in path for path in files) and _FULL_ID.fullmatch(parent):
        # files at the top only (the usual knob file): one new tree, no index
        return commit_tree(repo, _top_tree(repo, parent, files), parent, message)
    with tempfile.TemporaryDirectory() as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", parent, env=env)
        for path, content in files.items():
            if content is None:
                git(repo, "update-index", "--force-remove", "--", path, env=env)
                continue
            blob = git(repo, "hash-object", "-w", "--stdin", input=content)
            mode = "100644"
            try:
                existing = git(repo, "ls-tree", parent, "--", path).split()
                if existing and existing[0] in ("100755", "100644"):
                    mode = existing[0]
            except GitError:
                pass
            git(repo, "update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}", env=env)
        tree = git(repo, "write-tree", env=env)
    return commit_tree(repo, tree, parent, message)


@functools.lru_cache(maxsize=64)
def _top_entries(repo: str, commit: str) -> tuple[tuple[str, str], ...]:
    """(name, "mode type id") of the top of `commit`'s tree (a full id: never changes)."""
    listing = git_bytes(Path(repo), "ls-tree", "-z", commit).decode("utf-8", "surrogateescape")
    return tuple((entry.partition("\t")[2], entry.partition("\t")[0])
                 for entry in listing.split("\0") if entry)


def _top_tree(repo: Path, parent: str, files: dict[str, bytes | None]) -> str:
    """`parent`'s tree with top-level `files` replaced (None deletes), by `git mktree`.

    A file keeps its executable bit; anything else it replaces (a symlink, a directory)
    becomes a regular file, as `update-index --cacheinfo` made it.
    """
    entries = dict(_top_entries(str(repo), parent))
    for path, content in files.items():
        if content is None:
            entries.pop(path, None)
            continue
        blob = git(repo, "hash-object", "-w", "--stdin", input=content)
        mode = entries.get(path, "").partition(" ")[0]
        entries[path] = f"{mode if mode in ('100755', '100644') else '100644'} blob {blob}"
    listing = "".join(f"{meta}\t{name}\0" for name, meta in entries.items())
    return git(repo, "mktree", "-z", input=listing.encode("utf-8", "surrogateescape"))


def commit_tree(repo: Path, tree: str, parent: str, message: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "ratchet",
        "GIT_AUTHOR_EMAIL": "ratchet@localhost",
        "GIT_COMMITTER_NAME": "ratchet",
        "GIT_COMMITTER_EMAIL": "ratchet@localhost",
    }
    return git(repo, "commit-tree", tree, "-p", parent, input=message.encode(), env=env)


def refs(repo: Path, *patterns: str) -> dict[str, tuple[str, str]]:
    """{ref: (object id, object type)} of the refs `git for-each-ref` lists for
    `patterns`, in one call (where a rev-parse each would start a process per ref)."""
    out = git(repo, "for-each-ref", "--format=%(refname) %(objectname) %(objecttype)",
              *patterns)
    listed = {}
    for line in out.splitlines():
        name, _, rest = line.partition(" ")
        sha, _, kind = rest.partition(" ")
        listed[name] = (sha, kind)
    return listed


def tree_of(repo: Path, commit: str) -> str:
    return git(repo, "rev-parse", f"{commit}^{{tree}}")


def archive_to(repo: Path, commit: str, dest: Path) -> None:
    """Materialise `commit`'s files into dest (no .git: a snapshot cannot move refs)."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        raise GitError(f"git archive {commit[:12]}: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)


def add_worktree(repo: Path, path: Path, commit: str) -> None:
    git(repo, "worktree", "add", "--detach", "--force", str(path), commit)


def remove_worktree(repo: Path, path: Path) -> None:
    with contextlib.suppress(GitError):
        git(repo, "worktree", "remove", "--force", str(path))
    git(repo, "worktree", "prune")


def commit_worktree(worktree: Path, message: str) -> str | None:
    """Commit everything in a candidate's worktree; None if it changed nothing."""
    git(worktree, "add", "-A")
    if not git(worktree, "status", "--porcelain"):
        return None
    env = {
        "GIT_AUTHOR_NAME": "ratchet",
        "GIT_AUTHOR_EMAIL": "ratchet@localhost",
        "GIT_COMMITTER_NAME": "ratchet",
        "GIT_COMMITTER_EMAIL": "ratchet@localhost",
    }
    git(worktree, "commit", "-q", "--no-verify", "-m", message, env=env)
    return git(worktree, "rev-parse", "HEAD")
