"""One sandbox for every untrusted party: proposers, candidate phases, the candidate child.

The agent CLI that writes a candidate, the candidate's build/run/smoke phases and the
evaluator's candidate child all start through `command()` (or `Jail`, its Popen), with a
`Policy` saying what the party may write, see and keep. Three levels, best first, decided
once per machine:

- `bwrap` (Debian package `bubblewrap`): the filesystem is read-only but the policy's
  writable paths, hidden paths are empty, /tmp and /dev/shm are private, and the party has
  its own PID namespace.
- `pidns` (util-linux `unshare`, no bubblewrap): its own PID and mount namespace; the warden
  mounts the hidden paths empty itself. Files outside the writable paths are guarded by the
  uid drop below (as root) and by detect-and-reject (hashes after each phase).
- `none`: no namespace; the warden is a subreaper. `ratchet status` says so.

Network: a party whose policy says `network=False` (every candidate phase and the candidate
child unless the task sets `[task] network = true`) gets a network namespace of its own
with only a loopback interface: bubblewrap's `--unshare-net`, or, at the other levels, the
warden's own `unshare(CLONE_NEWNET)` (it has the power as root, or as root of unshare's
user namespace). Nothing on the machine's loopback (Ray's job server, `ratchet serve`, a
database) nor beyond is reachable; abstract Unix sockets are per namespace too. Where no
namespace can be made (`none`, not root) the party keeps the network and `status` says so.

At every level the party's first process is the **warden** (`warden.py`), which, when the
job runs as root, drops the party to an unprivileged uid of its own (so it cannot read the
trusted processes' /proc, environment or descriptors, signal them, or write what root
owns), kills every process left when the party ends, and freezes the whole tree on request.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import socket
import stat
import subprocess
import sys
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from ratchet.job import egress

WARDEN = Path(__file__).with_name("warden.py")
# The warden is started by importing it from its own directory, not run by file path: a
# script run by path is compiled from source at every start, a module loads its cached
# bytecode (checked against the source). About 5 ms of CPU of a ~23 ms start, paid by
# every sandboxed party. Its directory goes last on sys.path, after the stdlib, so the
# warden's own stdlib imports never resolve to a sibling module; `-I -S` as before.
WARDEN_ARGV = (sys.executable, "-I", "-S", "-c",
               f"import sys; sys.path.append({str(WARDEN.parent)!r}); import warden; "
               "sys.exit(warden.main())")
# uids handed to untrusted parties: one per sandbox seed, far above any real account
UNTRUSTED_UID_BASE = 3_000_000
UNTRUSTED_UID_SPAN = 1_000_000
# the trusted evaluator's own uids (never root, never a candidate's): a range of their own
EVALUATOR_UID_BASE = 2_000_000
# Set by the worker for every phase ("1": the task has `network = true`), so the evaluator
# gives its candidate child the same network as the phases
NETWORK_ENV = "RATCHET_NETWORK"


class Level(StrEnum):
    BWRAP = "bwrap"
    PIDNS = "pidns"
    NONE = "none"


class SandboxUnavailable(RuntimeError):
    """The level asked for does not work on this machine."""


# Kept for callers that name the levels as module constants.
BWRAP, PIDNS, NONE = Level.BWRAP, Level.PIDNS, Level.NONE


def untrusted_uid(seed: str) -> int:
    """A uid for untrusted parties, stable for its seed: one per study, so the phases of a
    job and the compile caches its jobs share agree on the owner of what they wrote."""
    return UNTRUSTED_UID_BASE + zlib.crc32(seed.encode()) % UNTRUSTED_UID_SPAN


def evaluator_uid(seed: str) -> int:
    """The uid the trusted evaluate and hold-out phases run as when the job runs as root:
    not root (an evaluator may import candidate code into its own process), and not the
    candidate's uid (whose files and processes it must not share)."""
    return EVALUATOR_UID_BASE + zlib.crc32(seed.encode()) % UNTRUSTED_UID_SPAN


@dataclass(frozen=True)
class Policy:
    """What an untrusted party may write, see and keep.

    `writable`: directories it may write (made writable for its uid by `grant`).
    `readonly`: extra paths it must be able to read even when an ancestor is private.
    `hidden`: paths it sees as empty directories (hold-out data, keys, other trees).
    `drop_privileges`: when the caller is root, run the party as `uid` (default: a uid of
    its own from `seed`), never as root.
    `keep_fds`: descriptors it keeps (everything else is closed).
    `network`: keep the machine's network; False (the default): a network namespace of its
    own with only loopback (see the module docstring).
    `shared_shm`: keep the caller's /dev/shm (the candidate child maps shared buffers there).
    `proxy`: with `network=False`, the Unix socket of an allow-listing proxy
    (`egress.Proxy`): the warden relays 127.0.0.1:`egress.PORT` inside the party's namespace
    to it, the party's only way out (agents reach their model this way).
    `control`: give the Jail a freeze/thaw channel to the warden.
    """

    writable: Sequence[Path | str] = ()
    readonly: Sequence[Path | str] = ()
    hidden: Sequence[Path | str] = ()
    drop_privileges: bool = True
    uid: int | None = None
    seed: str = "ratchet"
    keep_fds: Sequence[int] = ()
    network: bool = False
    shared_shm: bool = False
    private_tmp: bool = True
    extra_visible: Sequence[Path | str] = field(default=())
    proxy: Path | str | None = None

    def party_uid(self) -> int | None:
        """The uid the party runs as, or None when it keeps the caller's."""
        if not self.drop_privileges or os.geteuid() != 0:
            return None
        return self.uid if self.uid is not None else untrusted_uid(self.seed)


# -- what works here -------------------------------------------------------------------------

def _probe(argv: list[str], expect: str = "1") -> bool:
    try:
        probe = subprocess.run(argv, capture_output=True, timeout=10, text=True,
                               stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0 and probe.stdout.strip() == expect


def _bwrap_modes() -> tuple[bool, bool]:
    """(bubblewrap works, it can also give a PID namespace), for the `bwrap` on PATH now."""
    return _bwrap_modes_of(shutil.which("bwrap"))


@functools.cache  # per executable: a caller may put another `bwrap` first on PATH
def _bwrap_modes_of(exe: str | None) -> tuple[bool, bool]:
    if not exe:
        return False, False
    base = [exe, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
    if _probe([*base, "--unshare-pid", "/bin/sh", "-c", "echo 1"]):
        return True, True
    return _probe([*base, "/bin/sh", "-c", "echo 1"]), False


def bwrap_works() -> bool:
    return _bwrap_modes()[0]


@functools.cache
def unshare_prefix() -> tuple[str, ...] | None:
    """The util-linux `unshare` command line that gives new PID and mount namespaces here.

    `--kill-child`: if `unshare` dies, its child (the warden, PID 1 of the namespace, and
    with it the whole namespace) is killed too.
    """
    exe = shutil.which("unshare")
    if not exe:
        return None
    tail = ["--pid", "--fork", "--mount-proc", "--kill-child"]
    choices = []
    if os.geteuid() == 0:
        choices.append([exe, *tail])
    # not root: root of a user namespace of our own, so the warden may mount the party's
    # view and make its network namespace (a mapped plain uid has no capabilities after
    # exec); the warden then takes every capability away from the party (--drop-caps)
    choices += [[exe, "--user", "--map-root-user", *tail],
                [exe, "--user", "--map-current-user", *tail]]
    for prefix in choices:
        if _probe([*prefix, "/bin/sh", "-c", "echo $$"]):
            return tuple(prefix)
    return None


@functools.cache
def _root_netns() -> bool:
    """Can the warden, as root but outside any namespace `unshare` made, give a party its
    own network namespace (not in a container that forbids it)? Probed once (~0.4 s)."""
    return os.geteuid() == 0 and _probe([*WARDEN_ARGV, "--no-network", "--", "/bin/sh", "-c", "echo 1"])


def network_isolated(level: Level | str) -> bool:
    """Does a party with `network=False` really lose the network at `level`?

    bwrap and pidns need no probe: where they make a PID namespace they have the power to
    make a network namespace too, and both fail closed (the party never starts with the
    machine's network). The evaluator's candidate child asks this in every evaluation."""
    level = Level(level)
    if level == Level.BWRAP:
        return True  # --unshare-net: bubblewrap fails rather than start without it
    if level == Level.PIDNS:
        return unshare_prefix() is not None
    return _root_netns()


def describe_network(allowed: bool, preference: str = "auto") -> str:
    """One line for `status` and the report: what network candidates' code has."""
    if allowed:
        return ("OPEN: [task] network = true, so every phase and the candidate child reach "
                "this machine's network, its loopback services (a Ray head's job server, "
                "`ratchet serve`, databases) and the internet")
    try:
        level = choose(preference)
    except SandboxUnavailable:
        return "unknown: the sandbox asked for is unavailable"
    if network_isolated(level):
        return ("none: every phase and the candidate child run in a network namespace of "
                "their own with only loopback ([task] network = true opens it)")
    return ("OPEN: this machine cannot give candidates a network namespace (neither "
            "bubblewrap nor unshare works, and ratchet is not root): they reach its network "
            "and loopback services")


def choose(preference: str) -> Level:
    """`auto`: the best level available; `bwrap`: bubblewrap or an error; `none`: nothing."""
    if preference == Level.NONE:
        return Level.NONE
    if preference in ("auto", Level.BWRAP) and bwrap_works():
        return Level.BWRAP
    if preference == Level.BWRAP:
        raise SandboxUnavailable(
            "sandbox = 'bwrap' was asked for but bubblewrap does not work here "
            "(install it: apt-get install bubblewrap)")
    if unshare_prefix() is not None:  # auto, or pidns decided on another machine
        return Level.PIDNS
    return Level.NONE


def describe(preference: str = "auto") -> str:
    try:
        kind = choose(preference)
    except SandboxUnavailable as exc:
        return f"unavailable: {exc}"
    if os.geteuid() != 0:
        who = "untrusted parties run as this user (ratchet is not root, so no uid drop)"
    elif kind == Level.NONE and private_ancestors(_runtime_paths(), untrusted_uid("probe")):
        who = ("untrusted parties run AS ROOT: the interpreter sits under a private "
               "directory and without a mount namespace no other uid could start it")
    else:
        who = "untrusted parties run as an unprivileged uid of their own"
    if kind == Level.BWRAP and _bwrap_modes()[1]:
        return ("bwrap (read-only filesystem except the job's directory; own PID "
                f"namespace); {who}")
    if kind == Level.BWRAP:
        return ("bwrap (read-only filesystem except the job's directory); NO PID namespace: "
                f"candidates can see other processes; {who}")
    if kind == Level.PIDNS:
        return ("pid namespace only (unshare): candidates see only their own processes; "
                f"no bubblewrap, so files are guarded by the uid and detect-and-reject; {who}")
    if preference == Level.NONE:
        return ("none (sandbox = \"none\"): candidates can see every process of this machine; "
                f"files guarded by detect-and-reject; {who}")
    return ("none: NO ISOLATION: neither bubblewrap nor a PID namespace (unshare) works "
            "here; candidates can see every process of this machine; files guarded by "
            f"detect-and-reject (hash checks); {who}")


# -- paths ----------------------------------------------------------------------------------

def _traversable(path: Path, uid: int) -> bool:
    try:
        st = path.stat()
    except OSError:
        return True  # nothing to open up
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    return bool(st.st_mode & stat.S_IXOTH)


def _runtime_paths() -> list[Path]:
    """What any party needs to read to run ratchet's Python and the tools on PATH."""
    paths = {Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix),
             Path(os.path.realpath(sys.executable)).parent.parent}
    paths.update(Path(p) for p in sys.path if p and Path(p).is_dir())
    on_path = [Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    paths.update(on_path)
    # a version manager's shims (pyenv's `python`) run its own scripts from its root
    paths.update(a for p in on_path for a in p.parents if a.name in (".pyenv", ".rbenv"))
    return sorted(p.resolve() for p in paths if p.is_absolute() and p.exists())


def private_ancestors(paths: Iterable[Path], uid: int) -> dict[Path, set[Path]]:
    """The private directories (no search permission for `uid`) above `paths`, each with the
    paths below it that must stay visible. A private directory is replaced by an empty one
    and only those paths are put back, so the party sees them and nothing beside them. /root
    is the usual one: a 0700 home holding the interpreter (pyenv) and the repository."""
    cover: dict[Path, set[Path]] = {}
    paths = [Path(os.path.abspath(p)) for p in paths]
    trees = set(paths)
    for path in paths:
        for ancestor in path.parents[::-1][1:]:  # "/" excluded, outermost first
            if ancestor in trees and not _traversable(ancestor, uid):
                # a needed tree (a venv, the checkout) keeps its own modes: only what is
                # above it is opened, never the tree itself (a venv closed to others is
                # closed to the party: reach.probe says so, with the fix)
                break
            if not _traversable(ancestor, uid):
                cover.setdefault(ancestor, set()).add(path)
                break
    # a private directory below another one is inside its cover already
    for inner in sorted(cover, key=lambda p: len(p.parts)):
        outer = next((o for o in cover if o != inner and o in inner.parents), None)
        if outer is not None:
            cover[outer] |= cover.pop(inner)
    # a path inside another kept one comes with it
    return {a: {p for p in keep if not any(o in p.parents for o in keep)}
            for a, keep in cover.items()}


def reachable(path: Path, uid: int) -> bool:
    """Can `uid` reach `path` (search permission on every directory above it)?"""
    path = Path(os.path.abspath(path))
    return all(_traversable(p, uid) for p in [*path.parents, path] if p != Path("/"))


def share(paths: Iterable[Path | str]) -> None:
    """Caches every job's party writes (compile caches): writable by all, like /tmp (sticky,
    so no party can delete another's files). Trusted phases never read these."""
    for path in paths:
        with contextlib.suppress(OSError):
            os.chmod(path, 0o1777)


def grant(paths: Iterable[Path | str], policy: Policy) -> None:
    """Make `paths` (and everything in them) the party's own, so its uid can write them.

    The trusted side calls this before starting the party; it reads what the party wrote
    afterwards as root. A symlink is changed, never followed.
    """
    uid = policy.party_uid()
    if uid is None:
        return
    for top in paths:
        top = Path(top)
        top.mkdir(parents=True, exist_ok=True)
        os.lchown(top, uid, uid)
        for root, dirs, files in os.walk(top):
            for name in dirs + files:
                with contextlib.suppress(FileNotFoundError):
                    os.lchown(os.path.join(root, name), uid, uid)


# -- the command line -------------------------------------------------------------------------

def _warden_argv(policy: Policy, *, pidns: bool, control_fd: int | None,
                 mount_plan: dict[str, list[str]] | None, no_network: bool = False,
                 own_netns: bool = False) -> list[str]:
    """`own_netns`: the party has a network namespace of its own (the warden's or
    bubblewrap's), so a proxy bridge inside it is the party's alone."""
    argv = list(WARDEN_ARGV)
    if pidns:
        argv.append("--pidns")
    if no_network:
        argv.append("--no-network")
    if policy.proxy is not None and (no_network or own_netns):
        argv += ["--bridge", f"{egress.PORT}:{policy.proxy}"]
    uid = policy.party_uid()
    if uid is not None:
        argv += ["--uid", str(uid), "--gid", str(uid)]
    elif pidns and mount_plan is not None and os.geteuid() != 0:
        # root of unshare's user namespace: capabilities there would let the party undo
        # the mounts that hide paths from it (an evaluator's candidate child, a non-root
        # study's phases)
        argv.append("--drop-caps")
    if control_fd is not None:
        argv += ["--control-fd", str(control_fd)]
    for fd in policy.keep_fds:
        argv += ["--keep-fd", str(fd)]
    for kind, paths in (mount_plan or {}).items():
        for path in paths:
            argv += [f"--{kind}", path]
    return [*argv, "--"]


def _needed(policy: Policy) -> list[Path]:
    """What the party must be able to read (the writable paths are bound on their own)."""
    return [*map(Path, policy.readonly), *map(Path, policy.extra_visible), *_runtime_paths()]


def private_cover(policy: Policy, uid: int | None) -> dict[Path, set[Path]]:
    """The private directories to open for the party, each with the paths put back in it.

    The writable paths count too: a job tree or an agent's copy under a 0700 parent (a
    `mktemp -d`, a home other than /root) is reached through the cover, then bound
    writable on its own (so it is not put back read-only first)."""
    if uid is None:
        return {}
    writable = [Path(os.path.abspath(w)) for w in policy.writable]
    cover = private_ancestors([*_needed(policy), *writable], uid)
    return {a: {p for p in keep if p not in writable} for a, keep in cover.items()}


def _readonly(policy: Policy) -> list[Path]:
    """Read-only paths that exist. They are put back after the hidden directories that hold
    writable paths are emptied (prepared data inside the study's state directory). The
    proxy's directory is one: `connect()` works on a read-only mount."""
    proxy = [Path(policy.proxy).parent] if policy.proxy is not None else []
    return [Path(p) for p in [*policy.readonly, *proxy] if Path(p).exists()]


def _under_tmp(policy: Policy, cover: Mapping[Path, set[Path]]) -> list[Path]:
    """What the party needs that lives under /tmp (a checkout and its venv there, say):
    put back read-only over its private /tmp, or it could not even start the warden."""
    if not policy.private_tmp:
        return []
    tmp = Path("/tmp")
    # what lies under a covered directory comes back with its cover
    found = sorted({p for p in _needed(policy) if tmp in p.parents
                    and not any(a == p or a in p.parents for a in cover)
                    and not any(Path(w) == p or Path(w) in p.parents for w in policy.writable)})
    return [p for p in found if not any(o in p.parents for o in found)]


def _split_hidden(policy: Policy) -> tuple[list[str], list[str]]:
    """Hidden paths that contain writable ones are emptied before those are put back (the
    study's state directory around the job's own); the others last (data inside a tree)."""
    first: list[str] = []
    last: list[str] = []
    for hidden in map(Path, policy.hidden):
        inside = any(hidden == w or hidden in Path(w).parents for w in policy.writable)
        (first if inside else last).append(str(hidden))
    return first, last


def command(level: Level | str, argv: Sequence[str], policy: Policy, *,
            control_fd: int | None = None) -> list[str]:
    """The full command line that runs `argv` as an untrusted party under `policy`."""
    level = Level(level)
    cover = private_cover(policy, policy.party_uid())
    if level == Level.BWRAP:
        return _bwrap_args(policy, cover) + _warden_argv(
            policy, pidns=_bwrap_modes()[1], control_fd=control_fd, mount_plan=None,
            own_netns=not policy.network) + list(argv)
    if level == Level.PIDNS and (prefix := unshare_prefix()):
        hide_first, hide_last = _split_hidden(policy)
        plan = {
            "cover": [str(a) for a in sorted(cover)] + hide_first
            + (["/tmp"] if policy.private_tmp else [])
            + (["/dev/shm"] if not policy.shared_shm and Path("/dev/shm").is_dir() else []),
            "bind-ro": [str(p) for p in _under_tmp(policy, cover)]
            + [str(p) for keep in cover.values() for p in sorted(keep)]
            + [str(p) for p in _readonly(policy)],
            "bind-rw": [str(p) for p in policy.writable],
            "hide": hide_last,
        }
        for path in policy.writable:
            Path(path).mkdir(parents=True, exist_ok=True)
        return [*prefix, *_warden_argv(policy, pidns=True, control_fd=control_fd,
                                       mount_plan=plan, no_network=_cut_off(policy, level)),
                *argv]
    if cover:
        # no mount namespace to open a private home with: better the caller's uid than a
        # party that cannot even start its interpreter
        policy = Policy(**{**policy.__dict__, "drop_privileges": False})
    return [*_warden_argv(policy, pidns=False, control_fd=control_fd, mount_plan=None,
                          no_network=_cut_off(policy, Level.NONE)), *argv]


def _cut_off(policy: Policy, level: Level) -> bool:
    """Should the warden make the party's network namespace itself (not bubblewrap)?"""
    return not policy.network and network_isolated(level)


def _bwrap_args(policy: Policy, cover: Mapping[Path, set[Path]]) -> list[str]:
    exe = shutil.which("bwrap") or "bwrap"
    # /dev is bound whole so GPUs (/dev/nvidia*) stay reachable; /proc is fresh and, with
    # its own PID namespace, shows the party's processes alone.
    args = [exe, "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc"]
    if _bwrap_modes()[1]:
        args.append("--unshare-pid")
    if not policy.network:
        args.append("--unshare-net")
    # private /tmp and /dev/shm are the party's to write, like the real ones (sticky, all
    # may write): coding agents need them (Codex mkdirs /tmp/codex-daemon-<uid>; Claude
    # Code ends silently without a writable /tmp)
    if not policy.shared_shm and Path("/dev/shm").is_dir():
        args += ["--perms", "1777", "--tmpfs", "/dev/shm"]
    if policy.private_tmp:
        args += ["--perms", "1777", "--tmpfs", "/tmp"]
    hide_first, hide_last = _split_hidden(policy)
    # directories replaced by an empty tmpfs: paths put back below them need their
    # parents made (bubblewrap would make them 0700, closed to the party's uid)
    empties = [Path(p) for p in ("/tmp", *map(str, cover), *hide_first)]
    made: set[Path] = set()

    def parents(path: Path) -> list[str]:
        """Make `path`'s parents that an empty directory above it hid, searchable."""
        hid = [d for d in path.parents[::-1]
               if d not in made and any(e in d.parents for e in empties)]
        made.update(hid)
        return [arg for d in hid for arg in ("--perms", "0755", "--dir", str(d))]

    def bind(flag: str, path: Path | str) -> list[str]:
        return [*parents(Path(path)), flag, str(path), str(path)]

    for needed in _under_tmp(policy, cover):
        args += bind("--ro-bind", needed)
    for ancestor, keep in sorted(cover.items()):
        # its own parents first, if a tmpfs above (a private /tmp) hid them
        args += [*parents(ancestor), "--perms", "0755", "--tmpfs", str(ancestor)]
        # the directories made below it before are gone with the tmpfs: make them again
        # (else bubblewrap makes a bound path's parents 0700, closed to the party's uid)
        made.difference_update({d for d in made if ancestor in d.parents})
        made.add(ancestor)
        for path in sorted(keep):
            if path.exists():
                args += bind("--ro-bind", path)
    for hidden in hide_first:
        if Path(hidden).is_dir():
            args += ["--tmpfs", hidden]
            # the directories made below it before are gone with the tmpfs: make them again
            # (else bubblewrap makes them 0700 root and the party cannot enter them)
            made.difference_update({d for d in made if Path(hidden) in d.parents})
    for seen in _readonly(policy):
        args += bind("--ro-bind", seen)
    for writable in policy.writable:
        Path(writable).mkdir(parents=True, exist_ok=True)
        args += bind("--bind", writable)
    for hidden in hide_last:
        if Path(hidden).is_dir():
            args += ["--tmpfs", hidden]
    # the party's view of the filesystem is set: drop bubblewrap's own powers before argv
    return [*args, "--die-with-parent", "--"]


# -- a running party --------------------------------------------------------------------------

class Jail:
    """An untrusted party running under `policy`: a Popen with whole-tree freeze and kill.

    `freeze()` returns once every process of the party is stopped (SIGSTOP, sent by the
    warden to each one, setsid'd daemons included); `thaw()` lets them run; `kill()` ends
    all of them. Extra keyword arguments go to `subprocess.Popen`.
    """

    def __init__(self, argv: Sequence[str], policy: Policy, *, level: Level | str,
                 **popen: Any) -> None:
        self.level = Level(level)
        self.policy = policy
        ours, theirs = socket.socketpair()
        self._control = ours
        pass_fds = tuple(popen.pop("pass_fds", ())) + tuple(policy.keep_fds) + (theirs.fileno(),)
        try:
            self.argv = command(self.level, argv, policy, control_fd=theirs.fileno())
            self.proc = subprocess.Popen(self.argv, pass_fds=pass_fds,
                                         start_new_session=True, **popen)
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self._owed: bytes | None = None  # the answer to a request sent without waiting

    def _ask(self, command: bytes, answer: bytes, timeout: float = 10.0, *, wait: bool = True) -> bool:
        if self.proc.poll() is not None:
            return False
        try:
            self._control.settimeout(timeout)
            if not self._collect():
                return False
            self._control.sendall(command)
            if not wait:
                self._owed = answer
                return True
            return self._control.recv(1) == answer
        except OSError:
            return False

    def _collect(self) -> bool:
        owed, self._owed = self._owed, None
        return owed is None or self._control.recv(1) == owed

    def freeze(self, *, wait: bool = True) -> bool:
        """Stop the whole party; True once it is stopped (False: it is gone).

        `wait=False`: only ask; `settle()` (or the next request) waits for the answer."""
        return self._ask(b"F", b"f", wait=wait)

    def settle(self) -> bool:
        """Wait for the answer to a freeze asked without waiting; True once it came (or none was owed)."""
        if self._owed is None:
            return True
        try:
            self._control.settimeout(10.0)
            return self._collect()
        except OSError:
            return False

    def thaw(self) -> bool:
        return self._ask(b"T", b"t")

    def kill(self, grace_s: float = 2.0) -> None:
        """End the whole party: the warden kills every process of it, then exits."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self._control.shutdown(socket.SHUT_WR)  # EOF: the warden ends the party
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(self.proc.pid, 9)  # the warden's group; the namespace dies with it
                self.proc.wait()
        self.close()

    def wait(self, timeout: float | None = None) -> int:
        return self.proc.wait(timeout=timeout)

    def poll(self) -> int | None:
        return self.proc.poll()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._control.close()

    def __enter__(self) -> Jail:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()
