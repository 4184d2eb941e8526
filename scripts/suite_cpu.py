"""Sum `make test-cpu`'s per-test CPU (tests/cpu_by_test.py) by file, largest first.

Usage: python scripts/suite_cpu.py DIR [--top N] [--tests]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path, help="the RATCHET_CPU_DIR of the run")
    parser.add_argument("--top", type=int, default=30, help="rows to print")
    parser.add_argument("--tests", action="store_true", help="by test, not by file")
    args = parser.parse_args()
    rows = [json.loads(line) for path in sorted(args.dir.glob("cpu-*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    if not rows:
        raise SystemExit(f"no rows in {args.dir}/cpu-*.jsonl: run `make test-cpu` first")
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for row in rows:
        key = row["test"] if args.tests else row["test"].split("::", 1)[0]
        entry = sums[key]
        entry[0] += row["cpu_s"]
        entry[1] += row["wall_s"]
        entry[2] += 1
    total = sum(entry[0] for entry in sums.values())
    print(f"{len(rows)} tests, {total:.0f} CPU-s in all "
          f"({total / 120:.1f} min on 2 cores at best)")
    print(f"{'CPU s':>8} {'wall s':>8} {'tests':>5} {'cum %':>6}  {'test' if args.tests else 'file'}")
    running = 0.0
    for key, (cpu, wall, count) in sorted(sums.items(), key=lambda kv: -kv[1][0])[:args.top]:
        running += cpu
        print(f"{cpu:8.1f} {wall:8.1f} {count:5d} {100 * running / total:6.1f}  {key}")


if __name__ == "__main__":
    main()
