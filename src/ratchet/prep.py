"""`[prep] run`: prepare data once into a content-addressed cache shared read-only by jobs.

The cache key covers the prep command and the pinned protected files (the prep script
is normally one of them), so changing either prepares afresh and an unchanged study
never prepares twice. Files are made read-only and their digest is recorded; the
worker re-checks the digest after every candidate phase.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path

from ratchet import gitrepo
from ratchet.jobspec import scrub_env
from ratchet.procs import run_capped
from ratchet.worker import data_digest


class PrepError(Exception):
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
