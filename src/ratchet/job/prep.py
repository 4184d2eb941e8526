"""`[prep] run`: prepare data once into a content-addressed cache shared read-only by jobs.

The cache key covers the prep command and the pinned protected files (the prep script
is normally one of them), so changing either prepares afresh and an unchanged study
never prepares twice. Files are made read-only and their digest (names, modes,
contents) is recorded; the worker re-checks the digest after every candidate phase.

Read-only does not bind root, and without bubblewrap nothing stops a candidate from
writing the cache. So the worker keeps a pristine copy beside it (made the first time
the data is seen intact), restores the cache from it, digest-checked, whenever it finds
the cache modified, and, where the data is small enough, gives each job a private copy:
the offender is rejected and the next candidate gets intact data.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path

from ratchet.core.errors import UserError
from ratchet.job import gitrepo
from ratchet.job.jobspec import scrub_env
from ratchet.job.procs import run_capped

DIGEST_VERSION = "v2:"  # v2: file and directory modes are part of the digest
PRIVATE_COPY_LIMIT = 512 << 20  # bytes; larger data is shared (restored when poisoned)


class DataError(UserError):
    """The prepared data is modified and no intact copy is left to restore it from."""


def data_digest(root: Path) -> str:
    """A digest of a prepared-data tree: names, permission bits, symlink targets, contents."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            digest.update(f"L {rel} {os.readlink(path)}\n".encode())
            continue
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_file():
            digest.update(f"F {rel} {mode:o}\n".encode())
            with path.open("rb") as fh:
                for block in iter(functools.partial(fh.read, 1 << 20), b""):
                    digest.update(block)
        elif path.is_dir():
            digest.update(f"D {rel} {mode:o}\n".encode())
        else:
            digest.update(f"O {rel} {mode:o}\n".encode())  # a fifo, a socket: planted
    return DIGEST_VERSION + digest.hexdigest()


def tree_size(root: Path) -> int:
    total = 0
    for path in root.rglob("*"):
        with contextlib.suppress(OSError):
            if path.is_file() and not path.is_symlink():
                total += path.lstat().st_size
    return total


def _remove_tree(root: Path) -> None:
    if root.is_symlink() or root.is_file():
        root.unlink()
        return
    if root.exists():
        _make_writable(root)
        shutil.rmtree(root)


def _copy_tree(source: Path, target: Path) -> None:
    """Copy with modes (read-only dirs get their mode after their contents)."""
    tmp = target.with_name(target.name + f".tmp{os.getpid()}")
    _remove_tree(tmp)
    shutil.copytree(source, tmp, symlinks=True, copy_function=shutil.copy2)
    _remove_tree(target)
    tmp.rename(target)


@contextlib.contextmanager
def _data_lock(data: Path):
    """Serialise restores of one cache entry between the workers sharing it."""
    lock_path = data.parent / ".data.lock"
    with open(lock_path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def pristine_path(data: Path) -> Path:
    return data.parent / "pristine"


def ensure_intact(data: Path, digest: str, keep_pristine: bool = True) -> str | None:
    """Make the shared data match `digest`, restoring it from the pristine copy if needed.

    Returns None if it was intact, or a note saying it was restored; raises DataError if
    neither the data nor its pristine copy is intact. The first time the data is found
    intact, the pristine copy is made from it (unless `keep_pristine` is False: under a
    read-only sandbox no candidate can write the data, and the copy would only cost disk).
    """
    with _data_lock(data):
        pristine = pristine_path(data)
        if data.is_dir() and not data.is_symlink() and data_digest(data) == digest:
            if keep_pristine and not pristine.is_dir():  # digest-checked when used
                with contextlib.suppress(OSError):  # best effort: a read-only cache
                    _copy_tree(data, pristine)
            return None
        if not (pristine.is_dir() and not pristine.is_symlink()
                and data_digest(pristine) == digest):
            raise DataError("prepared data ($RATCHET_DATA) is modified and no intact copy "
                            "is left to restore it from; run `ratchet prep --force`")
        _copy_tree(pristine, data)
        if data_digest(data) != digest:
            raise DataError("prepared data ($RATCHET_DATA) could not be restored")
        return "prepared data ($RATCHET_DATA) was found modified and restored from its pristine copy"


def private_copy(data: Path, digest: str, target: Path) -> bool:
    """A job's own copy of intact shared data (small data only); False if too large."""
    if tree_size(data) > PRIVATE_COPY_LIMIT:
        return False
    for _ in range(2):
        ensure_intact(data, digest)
        with _data_lock(data):
            _copy_tree(data, target)
        if data_digest(target) == digest:  # written to while we copied: copy again
            return True
    with _data_lock(data):
        _copy_tree(pristine_path(data), target)
    if data_digest(target) != digest:
        raise DataError("prepared data ($RATCHET_DATA): no intact copy could be made")
    return True


class PrepError(UserError):
    pass


def prep_key(command: str, pinned: dict[str, dict]) -> str:
    digest = hashlib.sha256(command.encode())
    for path in sorted(pinned):
        digest.update(f"\0{path}\0{pinned[path]['sha256']}".encode())
    return digest.hexdigest()[:16]


def make_readonly(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        if path.is_symlink():
            continue
        mode = path.stat().st_mode
        path.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def _make_writable(root: Path) -> None:
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | stat.S_IWUSR)


def prepare(
    repo: Path,
    state_dir: Path,
    command: str,
    pinned_commit: str,
    pinned: dict[str, dict],
    env_allow: list[str],
    timeout_s: float,
    force: bool = False,
) -> tuple[Path, str]:
    """Run prep if its cache entry is missing; return (data dir, digest)."""
    key = prep_key(command, pinned)
    root = state_dir / "cache" / "prep" / key
    data, manifest = root / "data", root / "manifest.json"
    if manifest.exists() and not force:
        info = json.loads(manifest.read_text())
        if str(info.get("digest", "")).startswith(DIGEST_VERSION):
            return data, info["digest"]
        info["digest"] = data_digest(data)  # a cache from before modes were digested
        manifest.write_text(json.dumps(info))
        return data, info["digest"]
    if root.exists():
        _make_writable(root)
        shutil.rmtree(root)
    work = root / "work"
    data.mkdir(parents=True)
    gitrepo.archive_to(repo, pinned_commit, work)
    env = scrub_env(dict(os.environ), env_allow)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["RATCHET_DATA"] = str(data)
    started = time.monotonic()
    code, timed_out, log, seconds = run_capped(
        ["/bin/sh", "-c", command],
        cwd=work,
        env=env,
        log_path=root / "prep.log",
        deadline=started + timeout_s,
        log_limit=4 << 20,
        reap_all_descendants=False,  # the driver's other children are running jobs
    )
    if timed_out or code != 0:
        tail = " | ".join(log.text().strip().splitlines()[-3:])
        why = "timed out" if timed_out else f"exit code {code}"
        raise PrepError(f"[prep] run = {command!r} failed ({why}): {tail}")
    shutil.rmtree(work, ignore_errors=True)
    make_readonly(data)
    digest = data_digest(data)
    manifest.write_text(json.dumps({"command": command, "digest": digest, "seconds": seconds,
                                    "created": time.time()}))
    return data, digest
