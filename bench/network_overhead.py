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

Two more parties changed with the allow-listing proxy and the evaluator's own uid, each
timed the old way and the new, interleaved, at every level:

- an agent making one request to its (loopback) model: before, the machine's network,
  straight to it; now a namespace of its own, the request through the warden's bridge and
  the proxy (`egress.Proxy`, started and closed per party, as the proposer does);
- the trusted evaluate phase starting a candidate child and calling it once: before, as
  root at the jobs' level; now as the evaluator's uid in the PID namespace `unshare`
  makes (the worker's `trusted_level`), its child sandboxed inside.

    python bench/network_overhead.py [--reps 31] [--only agent,evaluator]
"""

from __future__ import annotations

import argparse
import http.server
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from sandbox_overhead import timed  # noqa: E402

from ratchet.job import egress, sandbox, warden  # noqa: E402
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


REQUEST = "import urllib.request; urllib.request.urlopen('http://127.0.0.1:{port}/').read()"
CHILD = "def f():\n    return 1\n"
EVALUATE = ("from ratchet.evaluator.isolate import CandidateProcess\n"
            "with CandidateProcess('solution.py') as c:\n    c.call('f')\n")


def run_timed(argv: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


class Model(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


def agent_request(level: Level, tmp: Path, proxied: bool) -> float:
    """One agent party making one request to its model: the old way (the network kept)
    or the new (its own namespace, the proxy made for it and closed after, as per run)."""
    base = {"PATH": os.environ["PATH"], "HOME": str(tmp)}
    argv = [sys.executable, "-c", REQUEST.format(port=MODEL_PORT[0])]
    if not proxied:
        return run_timed(sandbox.command(level, argv, Policy(writable=[tmp], network=True,
                                                             seed="bench-agent")), tmp, base)
    start = time.perf_counter()
    with egress.Proxy(egress.AllowList([egress.Endpoint("127.0.0.1", MODEL_PORT[0])])) as proxy:
        policy = Policy(writable=[tmp], network=False, proxy=proxy.socket_path, seed="bench-agent")
        env = {**base, **dict.fromkeys(egress.PROXY_ENV, egress.PROXY_URL)}
        subprocess.run(sandbox.command(level, argv, policy), cwd=tmp, check=True,
                       stdout=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


MODEL_PORT = [0]


def evaluator_party(level: Level, work: Path, state: Path, own_uid: bool) -> float:
    """The trusted phase with one candidate-child call: as root at `level` (before) or as
    the evaluator's uid in unshare's PID namespace (now)."""
    tmp = work.parent / "trusted-tmp"
    policy = Policy(writable=[work, tmp], hidden=[state], seed=str(state),
                    drop_privileges=own_uid,
                    uid=sandbox.evaluator_uid(str(state)) if own_uid else None)
    sandbox.grant([tmp], policy)
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp), "TMPDIR": str(tmp),
           "PYTHONPATH": str(ROOT / "src")}
    where = Level.PIDNS if own_uid else level
    return run_timed(sandbox.command(where, [sys.executable, "-c", EVALUATE], policy), work, env)


def changed_parties(levels: list[Level], reps: int, only: set[str]) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ratchet-bench-parties-"))
    os.chmod(tmp, 0o755)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Model)
    MODEL_PORT[0] = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        agent_home = tmp / "agent"
        agent_home.mkdir()
        sandbox.grant([agent_home], Policy(seed="bench-agent"))
        state = tmp / ".ratchet"
        work = state / "jobs" / "j1" / "work"
        work.mkdir(parents=True)
        (work / "solution.py").write_text(CHILD)
        os.chmod(work, 0o755)
        print(f"{'level':6} {'party':34} {'before ms':>10} {'now ms':>8} {'diff ms':>8}")
        for level in levels:
            cases = []
            if "agent" in only and level != Level.NONE:
                cases.append(("agent: one request to its model",
                              lambda new, lv=level: agent_request(lv, agent_home, new)))
            if "evaluator" in only and os.geteuid() == 0 and level != Level.NONE \
                    and sandbox.unshare_prefix() is not None:
                cases.append(("evaluate: start child, one call",
                              lambda new, lv=level: evaluator_party(lv, work, state, new)))
            for label, party in cases:
                times: dict[bool, list[float]] = {True: [], False: []}
                for rep in range(reps):
                    for new in ((False, True) if rep % 2 == 0 else (True, False)):
                        times[new].append(party(new))
                before = statistics.median(times[False]) * 1e3
                now = statistics.median(times[True]) * 1e3
                print(f"{level:6} {label:34} {before:10.1f} {now:8.1f} {now - before:8.1f}")
    finally:
        server.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=31)
    parser.add_argument("--only", default="namespace,agent,evaluator",
                        help="comma-separated: namespace, agent, evaluator")
    args = parser.parse_args()
    only = set(args.only.split(","))
    levels = [lv for lv, ok in ((Level.BWRAP, sandbox.bwrap_works()),
                                (Level.PIDNS, sandbox.unshare_prefix() is not None),
                                (Level.NONE, True)) if ok]
    if only & {"agent", "evaluator"}:
        print(f"changed parties, {args.reps} reps each, interleaved; euid {os.geteuid()}; "
              f"{os.cpu_count()} cores; load {os.getloadavg()[0]:.1f}")
        changed_parties(levels, args.reps, only)
    if "namespace" not in only:
        return 0
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
