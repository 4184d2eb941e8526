"""What the one sandbox costs per untrusted party: the warden, the uid drop, the mounts.

Side by side in one run, interleaved (old, new, new, old, ...) so load drift hits both, at
every level this machine offers:
- old: the sandbox before the warden (bubblewrap's or unshare's command line around argv:
  the same namespaces, no warden, no uid drop, no hidden state);
- new: `sandbox.command(level, argv, Policy(...))` as the worker uses it for a candidate
  phase (writable work and tmp, the study's state hidden, the party as its own uid).
The party is `python -c pass` (a phase's smallest real work) and `/bin/true` (the floor).
It also times `sandbox.grant` (the uid's ownership of a 200-file work tree) and a
freeze/thaw round trip of a running party.

    python bench/sandbox_overhead.py [--reps 15]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from ratchet.job import sandbox  # noqa: E402
from ratchet.job.sandbox import Jail, Level, Policy  # noqa: E402


def old_command(level: Level, argv: list[str], work: Path) -> list[str]:
    if level == Level.BWRAP:
        return ["bwrap", "--ro-bind", "/", "/", "--dev-bind", "/dev", "/dev", "--proc", "/proc",
                "--unshare-pid", "--tmpfs", "/dev/shm", "--bind", str(work), str(work),
                "--die-with-parent", "--", *argv]
    if level == Level.PIDNS:
        return [*(sandbox.unshare_prefix() or ()), *argv]
    return argv


def timed(argv: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL,
                   env={"PATH": os.environ["PATH"], "HOME": str(cwd)})
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args()
    levels = [lv for lv, ok in ((Level.BWRAP, sandbox.bwrap_works()),
                                (Level.PIDNS, sandbox.unshare_prefix() is not None),
                                (Level.NONE, True)) if ok]
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-bench-sandbox-"))
    try:
        state = tmp / ".ratchet"
        work = state / "jobs" / "j1" / "work"
        work.mkdir(parents=True)
        (state / "ledger.db").write_text("")
        policy = Policy(writable=[work, state / "jobs" / "j1" / "tmp"], hidden=[state],
                        seed=str(state))
        sandbox.grant(policy.writable, policy)
        print(f"sandbox overhead, {args.reps} reps each, interleaved; euid {os.geteuid()}; "
              f"{os.cpu_count()} cores")
        print(f"{'level':6} {'party':16} {'old ms':>8} {'new ms':>8} {'new-old ms':>11}")
        for level in levels:
            for label, argv in (("python -c pass", [sys.executable, "-c", "pass"]),
                                ("/bin/true", ["/bin/true"])):
                old, new = [], []
                for rep in range(args.reps):
                    pair = [("old", old_command(level, argv, work)),
                            ("new", sandbox.command(level, argv, policy))]
                    for name, cmd in (pair if rep % 2 == 0 else pair[::-1]):
                        (old if name == "old" else new).append(timed(cmd, work))
                o, n = statistics.median(old) * 1e3, statistics.median(new) * 1e3
                print(f"{level:6} {label:16} {o:8.1f} {n:8.1f} {n - o:11.1f}")
        tree = tmp / "tree"
        for i in range(200):
            (tree / f"d{i % 10}").mkdir(parents=True, exist_ok=True)
            (tree / f"d{i % 10}" / f"f{i}.py").write_text("x = 1\n")
        grants = []
        for _ in range(args.reps):
            start = time.perf_counter()
            sandbox.grant([tree], policy)
            grants.append(time.perf_counter() - start)
        print(f"grant (200 files, 10 dirs): {statistics.median(grants) * 1e3:.2f} ms")
        for level in levels:
            with Jail([sys.executable, "-c", "import time; time.sleep(30)"], policy,
                      level=level, cwd=work, env={"PATH": os.environ["PATH"]}) as jail:
                time.sleep(0.3)
                rounds = []
                for _ in range(args.reps):
                    start = time.perf_counter()
                    jail.freeze()
                    jail.thaw()
                    rounds.append(time.perf_counter() - start)
            print(f"freeze+thaw ({level}): {statistics.median(rounds) * 1e3:.2f} ms")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
