"""A private local Ray cluster, safe on a shared host (fixture + `scripts/ray_cluster.sh`).

- its own temp dir (a short one: Ray's socket paths must stay under 108 bytes);
- free loopback ports for every listener Ray opens (GCS, dashboard, dashboard agent,
  runtime-env agent, metrics, node manager, object manager, Ray Client, workers), so a
  cluster on the default ports (6379, 8265, 10001, ...) is never touched;
- loopback only: `--node-ip-address=127.0.0.1` with `RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`
  (without it Ray 2.x swaps a loopback address for the first interface's);
- `ray start --head --block` in a session of its own: the head's processes share its
  kernel fate and its process group. Stopping signals that process (Ray shuts its
  children down on SIGTERM), then that process group, then any process left whose
  command line names our temp dir, each by pid. `ray stop` is never used: it stops
  every Ray cluster on the machine.

Usage as a script: `python tests/backends/ray_cluster.py start|stop|status STATE.json`.
The fixture reuses a running cluster whose STATE.json is named by RATCHET_RAY_STATE
(`scripts/ray_cluster.sh start` writes one) instead of starting its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

try:
    import pytest
except ImportError:  # used as a script without the test dependencies
    pytest = None

CPUS = int(os.environ.get("RAY_NUM_CPUS", "2"))
GPUS = int(os.environ.get("RAY_NUM_GPUS", "2"))
PORT_NAMES = ("port", "dashboard-port", "dashboard-agent-listen-port",
              "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port",
              "node-manager-port", "object-manager-port", "ray-client-server-port")
WORKER_PORTS = 64  # one per worker process; a test cluster runs a dozen at most


def _ray() -> str:
    exe = Path(sys.executable).parent / "ray"
    return str(exe) if exe.exists() else "ray"


def env() -> dict[str, str]:
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def free_ports(count: int, avoid: range = range(0)) -> list[int]:
    """Distinct ports free on loopback now (held open together so they differ), none in `avoid`.

    Ray refuses to start when one listener's port falls inside the worker port range, and
    the kernel's ephemeral ports can land there: ask again for any that do.
    """
    socks, ports = [], []
    try:
        while len(ports) < count:
            sock = socket.socket()
            sock.bind(("127.0.0.1", 0))
            socks.append(sock)  # held open even when skipped, so it is not handed out again
            port = sock.getsockname()[1]
            if port not in avoid:
                ports.append(port)
            if len(socks) > 50 * count:
                raise RuntimeError("no free ports outside Ray's worker range")
        return ports
    finally:
        for sock in socks:
            sock.close()


def free_range(size: int) -> int:
    """The first port of `size` consecutive ports all free on loopback now."""
    for _ in range(200):
        base = 20000 + int.from_bytes(os.urandom(2), "big") % 40000
        socks = []
        try:
            for port in range(base, base + size):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
    raise RuntimeError("no free range of ports for Ray's workers")


def start(default_ports: bool = False, timeout: float = 120.0) -> dict:
    """Start a head node; return its description (pid, ports, addresses, temp dir).

    A port found free can be taken by another process before Ray binds it; Ray then
    exits naming the port, and a fresh set of ports is tried (three times at most).
    """
    for attempt in range(3):
        try:
            return _start_once(default_ports, timeout)
        except PortTaken:
            if default_ports or attempt == 2:
                raise
    raise AssertionError("unreachable")


class PortTaken(RuntimeError):
    """`ray start` exited because a port it was given is in use."""


def _start_once(default_ports: bool, timeout: float) -> dict:
    temp = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
    if default_ports:  # Ray's defaults: for the test that another cluster survives ours
        ports = {"port": 6379, "dashboard-port": 8265}
        args = []
    else:
        base = free_range(WORKER_PORTS)
        workers = range(base, base + WORKER_PORTS)
        ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES), workers), strict=True))
        args = [f"--{k}={v}" for k, v in ports.items()]
        args += [f"--min-worker-port={base}", f"--max-worker-port={base + WORKER_PORTS - 1}"]
    log = open(Path(temp) / "start.log", "wb")  # noqa: SIM115 - the child keeps it
    proc = subprocess.Popen(
        [_ray(), "start", "--head", "--block", f"--temp-dir={temp}",
         "--node-ip-address=127.0.0.1", f"--num-cpus={CPUS}", f"--num-gpus={GPUS}",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1",
         "--object-store-memory=200000000", "--disable-usage-stats", *args],
        env=env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    info = {"pid": proc.pid, "created": psutil.Process(proc.pid).create_time(),
            "temp_dir": temp, "ports": ports,
            "gcs": f"127.0.0.1:{ports['port']}",
            "address": f"http://127.0.0.1:{ports['dashboard-port']}"}
    try:
        wait_ready(info, proc, timeout)
    except BaseException:
        stop(info)
        raise
    return info


def wait_ready(info: dict, proc: subprocess.Popen | None, timeout: float) -> None:
    """Until the job server runs a trivial job ("No available agent" early on is normal)."""
    from ray.job_submission import JobSubmissionClient

    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            log = (Path(info["temp_dir"]) / "start.log").read_text(errors="replace")
            taken = ("trying to use a port number" in log
                     or "address already in use" in log.lower())
            kind = PortTaken if taken else RuntimeError
            raise kind(f"ray start exited ({proc.returncode}): {log[-1500:]}")
        try:
            client = JobSubmissionClient(info["address"])
            probe = client.submit_job(entrypoint="true")
            while str(client.get_job_status(probe)) not in ("SUCCEEDED", "FAILED", "STOPPED"):
                time.sleep(0.5)
            return
        except Exception as exc:  # noqa: BLE001
            last = exc
            time.sleep(1)
    raise RuntimeError(f"the Ray job server did not answer within {timeout:g}s: {last}")


def _ours(info: dict) -> list[psutil.Process]:
    """This cluster's processes: the head's process group, those naming our temp dir,
    and their descendants (Ray's workers start sessions of their own)."""
    found: dict[int, psutil.Process] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error, OSError):
            mine = os.getpgid(proc.pid) == info["pid"]
            mine = mine or any(info["temp_dir"] in part for part in proc.info["cmdline"] or [])
            if mine:
                found[proc.pid] = proc
                for child in proc.children(recursive=True):
                    found[child.pid] = child
    found.pop(os.getpid(), None)
    return list(found.values())


def head_alive(info: dict) -> bool:
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(info["pid"])
        return abs(proc.create_time() - info["created"]) < 1.0 and proc.is_running() and \
            proc.status() != psutil.STATUS_ZOMBIE
    return False


def stop(info: dict, grace: float = 20.0) -> None:
    """Stop this cluster's processes only, each by pid."""
    procs = _ours(info)  # before the head goes: afterwards its workers are orphans
    if head_alive(info):
        with contextlib.suppress(ProcessLookupError):
            os.kill(info["pid"], signal.SIGTERM)  # Ray drains and stops its children
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and _alive(procs):
        time.sleep(0.25)
    for proc in _alive(procs) + _ours(info):  # whatever ignored the polite request
        with contextlib.suppress(psutil.Error):
            proc.kill()  # psutil checks the pid still names the same process
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(info["pid"], os.WNOHANG)
    import shutil

    # dying processes may still write their last files: remove until it stays removed
    for _ in range(10):
        shutil.rmtree(info["temp_dir"], ignore_errors=True)
        if not Path(info["temp_dir"]).exists() and not _alive(_ours(info)):
            break
        for proc in _alive(_ours(info)):
            with contextlib.suppress(psutil.Error):
                proc.kill()
        time.sleep(0.5)


def _alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    alive = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(proc)
    return alive


_session_started: list[dict] = []  # the cluster session_cluster started, until stopped


def session_cluster():
    """A private cluster for the session; yields its description (see `start`)."""
    pytest.importorskip("ray.job_submission", reason="needs ray[default]")
    given = os.environ.get("RATCHET_RAY_STATE")
    if given and Path(given).is_file():  # a cluster from scripts/ray_cluster.sh: reuse it
        info = json.loads(Path(given).read_text())
        if not head_alive(info):
            pytest.skip(f"the cluster in RATCHET_RAY_STATE={given} is not running")
        yield info
        return
    try:
        info = start()
    except (RuntimeError, OSError) as exc:
        pytest.skip(f"could not start a local Ray cluster: {exc}")
    _session_started.append(info)
    try:
        yield info
    finally:
        stop_session_cluster()


def stop_session_cluster() -> None:
    """Stop the cluster `session_cluster` started, once (a reused one is not ours)."""
    while _session_started:
        stop(_session_started.pop())


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop", "status"):
        sys.stderr.write("usage: ray_cluster.py start|stop|status STATE.json\n")
        return 2
    verb, state = argv[0], Path(argv[1])
    if verb == "start":
        if state.exists() and head_alive(json.loads(state.read_text())):
            sys.stderr.write(f"a cluster from {state} is already running\n")
            return 1
        info = start(default_ports=os.environ.get("RAY_DEFAULT_PORTS") == "1")
        state.write_text(json.dumps(info, indent=1))
        print(f"ray cluster up: job server {info['address']}, GCS {info['gcs']} "
              f"(temp dir {info['temp_dir']}; state in {state})")
        return 0
    if not state.exists():
        sys.stderr.write(f"no cluster recorded in {state}\n")
        return 1 if verb == "status" else 0
    info = json.loads(state.read_text())
    if verb == "status":
        alive = head_alive(info)
        print(f"{'running' if alive else 'not running'}: job server {info['address']}, "
              f"GCS {info['gcs']}")
        return 0 if alive else 1
    stop(info)
    state.unlink()
    print(f"stopped the cluster in {info['temp_dir']}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
