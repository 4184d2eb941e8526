"""Thin, explicit git plumbing.

Candidates are built with plumbing (a private index file, `commit-tree`, `update-ref`)
so the user's checkout, index and working tree are never touched.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


class GitError(Exception):
    pass


def git(repo: Path, *args: str, input: bytes | None = None, env: dict | None = None) -> str:
    out = git_bytes(repo, *args, input=input, env=env)
    return out.decode("utf-8", "replace").strip()


def git_bytes(repo: Path, *args: str, input: bytes | None = None, env: dict | None = None) -> bytes:
    full_env = {**os.environ, **(env or {})}
    # Keep commits reproducible and never prompt.
    full_env.setdefault("GIT_TERMINAL_PROMPT", "0")
    proc = subprocess.run(
        ["git", "-C", str(repo), *args],
        input=input,
        capture_output=True,
        env=full_env,
    )
    if proc.returncode != 0:
        message = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise GitError(f"git {' '.join(args[:3])}: {message[-1] if message else 'failed'}")
    return proc.stdout


def is_repo(path: Path) -> bool:
    try:
        return git(path, "rev-parse", "--is-inside-work-tree") == "true"
    except (GitError, FileNotFoundError):
        return False


def toplevel(path: Path) -> Path:
    return Path(git(path, "rev-parse", "--show-toplevel"))


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


def show(repo: Path, commit: str, path: str) -> bytes:
    return git_bytes(repo, "show", f"{commit}:{path}")


def update_ref(repo: Path, ref: str, new: str, old: str | None = None, reason: str = "") -> None:
    args = ["update-ref", "-m", reason or "ratchet", ref, new]
    if old is not None:
        args.append(old)
    git(repo, *args)


def is_dirty(repo: Path) -> bool:
    return bool(git(repo, "status", "--porcelain", "--untracked-files=no"))


def exclude_locally(repo: Path, patterns: list[str]) -> None:
    """Keep ratchet's own files out of `git status` without touching .gitignore."""
    exclude = Path(git(repo, "rev-parse", "--git-path", "info/exclude"))
    if not exclude.is_absolute():
        exclude = repo / exclude
    exclude.parent.mkdir(parents=True, exist_ok=True)
    existing = exclude.read_text().splitlines() if exclude.exists() else []
    missing = [p for p in patterns if p not in existing]
    if missing:
        with exclude.open("a") as fh:
            fh.write("".join(f"{p}\n" for p in missing))


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
    return git(repo, "diff", "--no-color", base, head)


def commit_files(
    repo: Path,
    parent: str,
    files: dict[str, bytes | None],
    message: str,
) -> str:
    """A new commit = parent's tree with `files` replaced (None deletes). No checkout."""
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


def commit_tree(repo: Path, tree: str, parent: str, message: str) -> str:
    env = {
        "GIT_AUTHOR_NAME": "ratchet",
        "GIT_AUTHOR_EMAIL": "ratchet@localhost",
        "GIT_COMMITTER_NAME": "ratchet",
        "GIT_COMMITTER_EMAIL": "ratchet@localhost",
    }
    return git(repo, "commit-tree", tree, "-p", parent, input=message.encode(), env=env)


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
