"""What the two-process kernel harness costs: wall time per evaluation of examples/kernel-cpu.

Side by side in one run, interleaved (old, new, new, old, ...) so load drift hits both:
- old: the in-process harness, `python evaluate.py` with `ratchet` and the example's
  evaluate.py taken from git at REV (default: the commit before the two-process harness);
- new: the same with this checkout's `ratchet` and evaluate.py (candidate in a child).
Both evaluate the same kernel.py (this checkout's), at its starting setting and at a
tuned one (the per-evaluation overhead weighs more when the kernel is fast).

    python bench/isolation_overhead.py [--rev 3035a09^] [--reps 7]

Prints, per kernel setting: the median wall time per variant, their ratio, the median of
the per-rep ratios (old and new ran back to back), and the ratio of CPU seconds used by
the evaluation's process tree (less sensitive to other load on the machine).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = "examples/kernel-cpu"
SETTINGS = {"start (CHUNK_ROWS=1)": {}, "tuned (CHUNK_ROWS=256, INPLACE=True)": {"CHUNK_ROWS": 256, "INPLACE": True}}


def extract(rev: str, dest: Path) -> None:
    """`src/` and the example at `rev`, via git archive (the repository is not touched)."""
    data = subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", rev, "src", EXAMPLE], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")


def kernel_source(settings: dict) -> str:
    from ratchet.proposers.knobs import set_knob  # the tuner's own knob writer

    source = (ROOT / EXAMPLE / "kernel.py").read_bytes()
    for name, value in settings.items():
        source = set_knob(source, name, value)
    return source.decode() if isinstance(source, bytes) else source


def evaluation(src: Path, example: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the evaluation's whole process tree)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(src)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "evaluate.py"], cwd=example, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if "correct: true" not in proc.stdout:
        raise SystemExit(f"evaluation in {example} failed:\n{proc.stdout}\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rev", default="3035a09^", help="git revision of the in-process harness")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ratchet-isolation-bench-"))
    try:
        old, new = work / "old", work / "new"
        extract(args.rev, old)
        new.mkdir()
        shutil.copytree(ROOT / "src", new / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        shutil.copytree(ROOT / EXAMPLE, new / EXAMPLE, ignore=shutil.ignore_patterns("__pycache__"))
        print(f"old: in-process harness at {args.rev}; new: this checkout; {args.reps} interleaved reps per variant")
        print(f"{'kernel setting':<38} {'old s':>7} {'new s':>7} {'new/old':>8} {'paired':>7} {'cpu new/old':>11}")
        for label, settings in SETTINGS.items():
            source = kernel_source(settings)
            for root in (old, new):
                (root / EXAMPLE / "kernel.py").write_text(source)
            times: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
            for rep in range(args.reps):
                order = ("old", "new") if rep % 2 == 0 else ("new", "old")
                for which in order:
                    root = old if which == "old" else new
                    times[which].append(evaluation(root / "src", root / EXAMPLE))
            wall_o = [w for w, _ in times["old"]]
            wall_n = [w for w, _ in times["new"]]
            o, n = statistics.median(wall_o), statistics.median(wall_n)
            # each rep ran old and new back to back: the median of per-rep ratios is the
            # figure least moved by load that drifts between reps
            paired = statistics.median(b / a for a, b in zip(wall_o, wall_n, strict=True))
            cpu = statistics.median(c for _, c in times["new"]) / statistics.median(c for _, c in times["old"])
            print(f"{label:<38} {o:>7.3f} {n:>7.3f} {n / o:>8.3f} {paired:>7.3f} {cpu:>11.3f}")
            print(f"    old wall: {' '.join(f'{t:.2f}' for t in wall_o)}")
            print(f"    new wall: {' '.join(f'{t:.2f}' for t in wall_n)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
