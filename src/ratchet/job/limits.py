"""Per-job bounds on processes and disk, watched while each phase runs.

- **pids**: a pids cgroup of the job's own (cgroup v2 where our cgroup delegates the pids
  controller, else the v1 `pids` hierarchy) that every phase joins before it starts, so a
  fork bomb meets EAGAIN and the phase is stopped at its first refused fork. Where no
  cgroup can be made, RLIMIT_NPROC of the party's dropped uid is the fallback (the kernel
  counts every process of that uid, so there the bound is the study's, not the job's).
- **disk**: the job's work and tmp directories are measured (a walk, paced by its own
  cost) and the phase is killed past `[backend] job_disk_gb`; the free space of the
  filesystem the job directory is on (the ledger's, for the local backend) is read far
  more often, and a job that ate into the reserve kept there is killed too.

A phase that passes a bound is stopped at once; the worker records it as the candidate's
failure (`crash`, the bound named), never as an infrastructure fault, and removes what the
job wrote, so the ledger can record it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

GIB = 1 << 30
RESERVE_SHARE = 0.05  # of the filesystem, when [backend] disk_reserve_gb is not set
RESERVE_MAX = 1 * GIB
STATVFS_EVERY_S = 0.02  # one syscall: cheap enough to read fifty times a second
WALK_MIN_S = 1.0  # a paced walk of the job's tree at most this often...
WALK_COST_FACTOR = 20  # ...and no walk more than 1/20 of the time


class Bound(StrEnum):
    PIDS = "pids"
    DISK = "disk"
    RESERVE = "disk reserve"


@dataclass(frozen=True)
class Breach:
    bound: Bound
    detail: str  # says which setting to raise, in one line


def _gib(n: float) -> str:
    return f"{n / GIB:.3g} GiB" if n >= GIB / 10 else f"{n / (1 << 20):.3g} MiB"


# -- pids ------------------------------------------------------------------------------------

def _own_cgroup(hierarchy: str) -> str | None:
    """Our cgroup's path in `hierarchy` ("" for the unified one), from /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers.split(",") == [hierarchy] or (not hierarchy and controllers == ""):
            return path
    return None


def _cgroup_parents() -> list[Path]:
    """Where a job's pids cgroup may be made, best first."""
    root = Path("/sys/fs/cgroup")
    found = []
    v2 = _own_cgroup("")
    if v2 is not None and (root / "cgroup.controllers").is_file():
        parent = root / v2.lstrip("/")
        with contextlib.suppress(OSError):
            if "pids" in (parent / "cgroup.subtree_control").read_text().split():
                found.append(parent)
    v1 = _own_cgroup("pids")
    if v1 is not None and (root / "pids" / "cgroup.procs").is_file():
        found.append(root / "pids" / v1.lstrip("/"))
    return found


class PidsBound:
    """The job's pids bound: a cgroup when one can be made, else RLIMIT_NPROC."""

    def __init__(self, job_id: str, limit: int | None) -> None:
        self.limit = limit
        self.cgroup: Path | None = None
        self._refused_before = 0
        if not limit or os.geteuid() != 0:
            return  # not root: the user's own limits are all there is
        for parent in _cgroup_parents():
            # the worker's pid too: two studies of one task name on a machine (two
            # checkouts, tests side by side) have the same job ids, and one's close()
            # removed the other's cgroup before its phase could join it
            path = parent / f"ratchet-{job_id}-{os.getpid()}"
            try:
                with contextlib.suppress(FileNotFoundError):
                    path.rmdir()  # an earlier attempt's, empty once its processes died
                path.mkdir()
                (path / "pids.max").write_text(str(limit))
            except OSError:
                with contextlib.suppress(OSError):
                    path.rmdir()
                continue
            self.cgroup = path
            break

    @property
    def kind(self) -> str:
        if not self.limit:
            return "none"
        return "cgroup" if self.cgroup is not None else "RLIMIT_NPROC of the party's uid"

    def join(self) -> None:
        """In a phase's child, before exec: the phase and all it starts are counted."""
        if self.cgroup is not None:
            with open(self.cgroup / "cgroup.procs", "w") as fh:
                fh.write("0")  # "0": the writing process itself
        elif self.limit:
            import resource

            # root is exempt; it binds the party's uid once the warden drops to it
            resource.setrlimit(resource.RLIMIT_NPROC, (self.limit, self.limit))

    def refused(self) -> int:
        """Forks refused by the cgroup so far (0 without one)."""
        if self.cgroup is None:
            return 0
        try:  # read every 20 ms while a phase runs: one open and read, no pathlib
            fd = os.open(f"{self.cgroup}/pids.events", os.O_RDONLY)
            try:
                text = os.read(fd, 4096).decode()
            finally:
                os.close(fd)
            for line in text.splitlines():
                name, _, count = line.partition(" ")
                if name == "max":
                    return int(count)
        except (OSError, ValueError):
            pass
        return 0

    def start_phase(self) -> None:
        self._refused_before = self.refused()

    def breach(self) -> Breach | None:
        if self.refused() > self._refused_before:
            return Breach(Bound.PIDS, f"a fork was refused at the job's pids bound of "
                                      f"{self.limit} ([backend] job_pids)")
        return None

    def close(self) -> None:
        """Remove the cgroup (call once the job's processes are gone)."""
        if self.cgroup is not None:
            for _ in range(50):  # the last processes may take a moment to leave
                try:
                    self.cgroup.rmdir()
                    return
                except FileNotFoundError:
                    return
                except OSError:
                    time.sleep(0.02)


# -- disk -----------------------------------------------------------------------------------

def tree_bytes(paths: Sequence[Path]) -> int:
    """Bytes allocated to the files under `paths` (a hard-linked file counted once)."""
    from ratchet.job.leftovers import walk  # the same walk as the leftovers check

    seen: set[tuple[int, int]] = set()
    total = 0
    for top in paths:
        for entry in walk(str(top)):
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if st.st_nlink > 1 and not entry.is_dir(follow_symlinks=False):
                    if (st.st_dev, st.st_ino) in seen:
                        continue
                    seen.add((st.st_dev, st.st_ino))
                total += st.st_blocks * 512
    return total


def free_bytes(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def default_reserve(path: Path) -> int:
    st = os.statvfs(path)
    return min(RESERVE_MAX, int(st.f_blocks * st.f_frsize * RESERVE_SHARE))


class DiskWatch:
    """The job's disk bound and the reserve of its filesystem, checked by `breach()`.

    The reserve is the job's fault when it is the main cause of the fall: the space the
    job's own tree gained is at least half of what the filesystem lost since the job
    began (another job filling the disk is not this one's doing).
    """

    def __init__(self, dirs: Sequence[Path], fs_path: Path, limit: int | None,
                 reserve: int | None) -> None:
        self.dirs = list(dirs)
        self.fs_path = fs_path
        self.limit = limit
        self.reserve = default_reserve(fs_path) if reserve is None else reserve
        self.used_at_start = tree_bytes(self.dirs)
        self.free_at_start = free_bytes(fs_path)
        self.used = self.used_at_start
        self._next_walk = 0.0  # the paced walk (when there is a job_disk_gb)
        self._next_urgent_walk = 0.0
        self._next_free = 0.0
        if not limit:
            self._next_walk = float("inf")  # only the reserve: walk when it is eaten

    def _walk(self, now: float) -> int:
        began = time.monotonic()
        self.used = tree_bytes(self.dirs)
        cost = time.monotonic() - began
        self._next_walk = now + max(WALK_MIN_S, WALK_COST_FACTOR * cost)
        self._next_urgent_walk = now + WALK_COST_FACTOR * cost
        return self.used

    def breach(self) -> Breach | None:
        now = time.monotonic()
        if now < self._next_free:
            return None
        self._next_free = now + STATVFS_EVERY_S
        try:
            free = free_bytes(self.fs_path)
        except OSError:
            return None
        fell = self.free_at_start - free
        # a fast writer passes the bound between two paced walks: walk at once when the
        # filesystem lost more than the job may write, or its reserve is being eaten
        urgent = free < self.reserve or bool(self.limit and fell > self.limit - self.used_at_start)
        if not (now >= self._next_walk or (urgent and now >= self._next_urgent_walk)):
            return None
        used = self._walk(now)
        if self.limit and used > self.limit:
            return Breach(Bound.DISK, f"the job's work and tmp directories reached "
                                      f"{_gib(used)}, over [backend] job_disk_gb = "
                                      f"{self.limit / GIB:g}")
        grew = used - self.used_at_start
        if free < self.reserve and grew > 0 and grew * 2 >= fell:
            return Breach(Bound.RESERVE, f"the job wrote {_gib(grew)} and left {_gib(free)} "
                                         f"free on the study's filesystem, under its reserve "
                                         f"of {_gib(self.reserve)} ([backend] "
                                         "disk_reserve_gb)")
        return None


class Watch:
    """Both bounds of one job, asked between polls of a running phase."""

    def __init__(self, pids: PidsBound, disk: DiskWatch | None) -> None:
        self.pids = pids
        self.disk = disk
        self.breached: Breach | None = None

    def start_phase(self) -> None:
        self.pids.start_phase()

    def stop_when(self, other: Callable[[], bool]) -> Callable[[], bool]:
        """`other`, or a bound passed (remembered in `breached`)."""
        def should_stop() -> bool:
            if other():
                return True
            if self.breached is None:
                self.breached = self.pids.breach() or (self.disk.breach() if self.disk else None)
            return self.breached is not None

        return should_stop


def empty(dirs: Sequence[Path]) -> None:
    """Remove what the job wrote (after a disk bound), keeping the directories."""
    import shutil

    for top in dirs:
        with contextlib.suppress(OSError):
            for entry in os.scandir(top):
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
