"""Overhead per candidate on local, Ray (slot actors, and one Ray Job per candidate) and
Slurm, side by side in one run, on a synthetic fixed-duration task.

The same study (K candidates per round, ROUNDS rounds, an evaluator that sleeps SLEEP_S
seconds) runs on each backend in turn with the same SLOTS slots (default K): local
`slots = SLOTS`; Ray on a private local cluster with SLOTS logical GPUs (`num_gpus = 1`,
`slots = SLOTS`); Slurm on a running single-node Slurm (scripts/slurm_local.sh start;
as many at once as the node has cores), if `sbatch` answers. Engine settings are the
defaults (poll intervals included). Overhead per candidate = (the
study's wall time - the critical path of the jobs' own phase times) / candidates, the
same measure as bench/fanout.py (it includes the driver's start-up, e.g. connecting to
Ray, spread over the candidates). Also shown: the median per job of (placed -> result
recorded) minus the job's own phase time, and the median engine queue wait (`queue_s`).

    .venv/bin/python bench/distributed.py [--sleep 1.0] [--k 2] [--slots K] [--rounds 4]
        [--only local,ray,ray-job,slurm] [--record]

A Ray cluster named by RATCHET_RAY_STATE (scripts/ray_cluster.sh start) is used as is;
otherwise one is started for the run and stopped after it (only its own processes).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests" / "backends"))  # ray_cluster: the private test cluster

from record import record  # noqa: E402  (bench/, next to this file)
from synthetic import make_repo  # noqa: E402

from ratchet.store.ledger import Ledger  # noqa: E402


def backend_keys(name: str, slots: int, base: Path, cluster: dict | None) -> tuple[str, str]:
    python = sys.executable
    if name == "local":
        return "local", f"slots = {slots}"
    if name in ("ray", "ray-job"):
        mode = "actors" if name == "ray" else "job"
        return "ray", "\n".join([
            "[backend.ray]", f'mode = "{mode}"', f'cluster = "{cluster["gcs"]}"',
            f'address = "{cluster["address"]}"', f'python = "{python}"', "num_gpus = 1",
            f"slots = {slots}",
            "num_cpus = 0"])
    return "shell", "\n".join([
        "[backend.shell]", 'preset = "slurm"', f'stage_dir = "{base / "stage"}"',
        f'python = "{python}"', 'vars = { sbatch_args = "--cpus-per-task=1" }'])


def one_run(name: str, k: int, slots: int, rounds: int, sleep: float, base: Path,
            cluster: dict | None) -> dict:
    kind, keys = backend_keys(name, slots, base, cluster)
    jobs = k * rounds
    repo = make_repo(base / name, name=f"dist-{name}", k=k, rounds=rounds, sleep=sleep,
                     kind=kind, backend_keys=keys, start=1000,
                     choices=range(100, 100 + 2 * jobs), timeout="2m")
    started = time.perf_counter()
    run = subprocess.run([str(ROOT / ".venv" / "bin" / "ratchet"), "run", "--repo", str(repo)],
                         capture_output=True, text=True)
    wall = time.perf_counter() - started
    if run.returncode != 0:
        raise RuntimeError(f"{name}: ratchet run failed: {run.stderr[-1500:]}")
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    try:
        cands = ledger.candidates()
    finally:
        ledger.close()
    assert len(cands) == jobs, (name, len(cands))
    own = {c.id: sum(p["seconds"] for p in c.phases or []) for c in cands}
    # the least wall time a round can take: its slowest job, or its jobs spread evenly
    # over the slots when there are more jobs than slots
    rounds_own: dict[int, list[float]] = {}
    for c in cands:
        rounds_own.setdefault(c.round, []).append(own[c.id])
    critical = sum(max(max(v), sum(v) / slots) for v in rounds_own.values())
    queue = [c.queue_s for c in cands if c.queue_s is not None]
    # each job's own latency beyond its phases: placed -> result recorded by the driver
    # (with more jobs than slots, this includes waiting for a slot)
    per_job = [c.finished_at - c.submitted_at - own[c.id] for c in cands
               if c.finished_at and c.submitted_at]
    return {"backend": name, "jobs": jobs, "wall": wall, "critical": critical,
            "overhead": (wall - critical) / jobs, "per_job": statistics.median(per_job),
            "queue_median": statistics.median(queue) if queue else float("nan")}


def slurm_up() -> bool:
    if not shutil.which("sbatch"):
        return False
    conf = Path(os.environ.get("RATCHET_SLURM_DIR", "/tmp/ratchet-slurm")) / "slurm.conf"
    if "SLURM_CONF" not in os.environ and conf.is_file():
        os.environ["SLURM_CONF"] = str(conf)
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleep", type=float, default=1.0)
    parser.add_argument("--k", type=int, default=2, help="candidates per round")
    parser.add_argument("--slots", type=int, default=0,
                        help="GPU slots (local slots, Ray logical GPUs); default: k")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--only", default="local,ray,ray-job,slurm")
    parser.add_argument("--record", action="store_true", help="write to bench/RESULTS.md (the previous run moves to HISTORY.md)")
    args = parser.parse_args()
    slots = args.slots or args.k
    wanted = args.only.split(",")
    skipped = []
    if "slurm" in wanted and not slurm_up():
        wanted.remove("slurm")
        skipped.append("slurm (no running Slurm: scripts/slurm_local.sh start)")
    import ray_cluster

    cluster, started_cluster = None, False
    if any(w.startswith("ray") for w in wanted):
        state = os.environ.get("RATCHET_RAY_STATE")
        if state and Path(state).is_file():
            cluster = json.loads(Path(state).read_text())
        else:
            os.environ["RAY_NUM_GPUS"] = str(slots)
            cluster, started_cluster = ray_cluster.start(), True
    base = Path(tempfile.mkdtemp(prefix="ratchet-dist-"))
    rows = []
    try:
        for name in wanted:
            rows.append(one_run(name, args.k, slots, args.rounds, args.sleep, base, cluster))
            print(f"{name}: {rows[-1]['overhead']:.3f} s/candidate", file=sys.stderr)
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if started_cluster:
            ray_cluster.stop(cluster)
    lines = [
        f"{args.k * args.rounds} candidates (K={args.k}, {slots} slots, {args.rounds} rounds), "
        "evaluator "
        f"sleeps {args.sleep:.2f} s, {os.cpu_count()} cores, load average "
        f"{os.getloadavg()[0]:.1f}, Python {platform.python_version()}",
        "| backend | wall s | jobs' own time s (critical path) | overhead s/candidate | "
        "median per job: placed to result minus own time, s | median queue_s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['wall']:.2f} | {r['critical']:.2f} | "
                     f"{r['overhead']:.3f} | {r['per_job']:.3f} | {r['queue_median']:.3f} |")
    lines.append("targets: ray <= 1 s/candidate (goal 0.3 s), slurm <= 2 s/candidate")
    lines += [f"skipped: {s}" for s in skipped]
    text = "\n".join(lines)
    print(text)
    if args.record:
        record(f"Distributed overhead: {args.only} (bench/distributed.py)",
               f".venv/bin/python bench/distributed.py --sleep {args.sleep} --k {args.k} "
               f"--slots {slots} --rounds {args.rounds} --only {args.only} --record", text)


if __name__ == "__main__":
    main()
