"""K=4 vs K=1 on a synthetic fixed-duration task, measured side by side in one run.

16 candidates of a task whose evaluator sleeps SLEEP_S seconds (so cores are not the
limit), run once with K=1 and once with K=4 (`[backend] slots = 4`). Prints the wall
times, their ratio, and ratchet's overhead per candidate: wall time minus the time the
jobs' own phases took (K=1: their sum; K=4: the sum over rounds of the slowest job).

    .venv/bin/python bench/fanout.py [--sleep 1.0] [--record]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from record import record  # noqa: E402  (bench/, next to this file)
from synthetic import make_repo  # noqa: E402

from ratchet.store.ledger import Ledger  # noqa: E402

JOBS = 16

def one_run(k: int, sleep: float, base: Path) -> dict:
    rounds = JOBS if k == 1 else JOBS // k  # round 1's first slot is the baseline
    repo = make_repo(base / f"k{k}", name="fanout", k=k, rounds=rounds, sleep=sleep,
                     start=1000, choices=range(100, 100 + 2 * JOBS), timeout="2m")
    started = time.perf_counter()
    subprocess.run([str(ROOT / ".venv" / "bin" / "ratchet"), "run", "--repo", str(repo)],
                   check=True, capture_output=True)
    wall = time.perf_counter() - started
    ledger = Ledger(repo / ".ratchet" / "ledger.db")
    cands = ledger.candidates()
    assert len(cands) == JOBS, len(cands)
    own = {c.id: sum(p["seconds"] for p in c.phases or []) for c in cands}
    per_round: dict[int, float] = {}
    for c in cands:
        per_round[c.round] = max(per_round.get(c.round, 0.0), own[c.id])
    critical = sum(per_round.values())
    return {"k": k, "wall": wall, "own_sum": sum(own.values()), "critical": critical,
            "overhead_per_candidate": (wall - critical) / JOBS}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sleep", type=float, default=1.0)
    parser.add_argument("--record", action="store_true", help="write to bench/RESULTS.md (the previous run moves to HISTORY.md)")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="ratchet-fanout-"))
    try:
        k1 = one_run(1, args.sleep, base)
        k4 = one_run(4, args.sleep, base)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    ratio = k1["wall"] / k4["wall"]
    lines = [
        f"{JOBS} candidates, evaluator sleeps {args.sleep:.2f} s, {os.cpu_count()} cores, "
        f"{platform.python_version()}",
        "| K | wall s | jobs' own time s (critical path) | overhead s/candidate |",
        "|---|---|---|---|",
    ]
    for r in (k1, k4):
        lines.append(f"| {r['k']} | {r['wall']:.2f} | {r['critical']:.2f} | "
                     f"{r['overhead_per_candidate']:.3f} |")
    lines.append(f"ratio K=1/K=4 wall time: **{ratio:.2f}** (target >= 3.8); "
                 f"overhead target <= 0.3 s/candidate")
    text = "\n".join(lines)
    print(text)
    if args.record:
        record(f"Fan-out (bench/fanout.py --sleep {args.sleep:g})",
               f".venv/bin/python bench/fanout.py --sleep {args.sleep:g} --record", text)


if __name__ == "__main__":
    main()
