"""What a party's own network namespace costs: the same sandboxed command, network kept or not.

Every candidate phase and the evaluator's candidate child start as one sandboxed party
(`sandbox.command`), now without the network unless the task asks (`Policy.network`):
bubblewrap's `--unshare-net`, or the warden's own `unshare(CLONE_NEWNET)` with loopback
brought up (pidns, and none as root). This times the same party both ways at every level
this machine offers, interleaved (with, without, without, with, ...) so load drift hits
both, and prints the medians and their difference. Target: <= 50 ms a party.

Whole parties take 0.1-1 s on a loaded machine, so their difference carries that noise;
the last line times the part that differs alone (as root): `unshare(CLONE_NEWNET)` and
bringing loopback up, as the warden does them, in a forked child each time.

    python bench/network_overhead.py [--reps 31]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from sandbox_overhead import timed  # noqa: E402

from ratchet.job import sandbox, warden  # noqa: E402
from ratchet.job.sandbox import Level, Policy  # noqa: E402


def namespace_ms(reps: int) -> list[float]:
    """The warden's own steps (a new network namespace, loopback up), timed in a forked
    child each (a namespace is the process's for good), in ms."""
    times = []
    for _ in range(reps):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: time the steps, report, leave
            os.close(read)
            start = time.perf_counter()
            warden.isolate_network()
            os.write(write, f"{(time.perf_counter() - start) * 1e3}".encode())
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as fh:
            times.append(float(fh.read()))
        os.waitpid(pid, 0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=31)
    args = parser.parse_args()
    levels = [lv for lv, ok in ((Level.BWRAP, sandbox.bwrap_works()),
                                (Level.PIDNS, sandbox.unshare_prefix() is not None),
                                (Level.NONE, True)) if ok]
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-bench-network-"))
    try:
        state = tmp / ".ratchet"
        work = state / "jobs" / "j1" / "work"
        work.mkdir(parents=True)
        writable = [work, state / "jobs" / "j1" / "tmp"]
        # a candidate phase's policy, as the worker makes it, with and without the network
        policies = {net: Policy(writable=writable, hidden=[state], seed=str(state), network=net)
                    for net in (True, False)}
        sandbox.grant(writable, policies[False])
        print(f"network namespace overhead, {args.reps} reps each, interleaved; euid "
              f"{os.geteuid()}; {os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
        print(f"{'level':6} {'party':16} {'isolated':>9} {'net ms':>8} {'no-net ms':>10} "
              f"{'diff ms':>8}")
        for level in levels:
            isolated = sandbox.network_isolated(level)
            for label, argv in (("/bin/true", ["/bin/true"]),
                                ("python -c pass", [sys.executable, "-c", "pass"])):
                times: dict[bool, list[float]] = {True: [], False: []}
                for rep in range(args.reps):
                    order = (True, False) if rep % 2 == 0 else (False, True)
                    for net in order:
                        times[net].append(timed(sandbox.command(level, argv, policies[net]), work))
                kept = statistics.median(times[True]) * 1e3
                cut = statistics.median(times[False]) * 1e3
                print(f"{level:6} {label:16} {isolated!s:>9} {kept:8.1f} {cut:10.1f} "
                      f"{cut - kept:8.1f}")
        if os.geteuid() == 0:
            warden._libc()  # loaded once, as the warden has it for its mounts
            steps = namespace_ms(args.reps)
            print(f"the steps alone (unshare(CLONE_NEWNET) + loopback up), {args.reps} reps: "
                  f"median {statistics.median(steps):.2f} ms, max {max(steps):.2f} ms")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
