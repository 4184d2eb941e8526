"""What confining the candidate child costs: wall time per evaluation of examples/kernel-cpu.

Side by side in one run, interleaved (the order rotates every rep) so load drift hits all:
- old: the two-process harness before issue 21 (`ratchet` and the example's evaluate.py
  from git at REV): the child a plain subprocess in its own process group;
- off: this checkout with `RATCHET_CHILD_SANDBOX=off` (same plain child, with this
  checkout's clean-twin calibration and freeze-while-filling);
- jail: this checkout as shipped (`auto`): the child under `sandbox.Jail` (bubblewrap or a
  PID namespace, an unprivileged uid when root, its tree frozen by the warden).
All evaluate the same kernel.py (this checkout's), at its starting setting and at a tuned
one (the per-evaluation overhead weighs more when the kernel is fast).

    python bench/isolation_overhead.py [--rev 37751ea] [--reps 7]

Prints, per kernel setting: the median wall time per variant, jail/old and jail/off, the
median of the per-rep ratios (the variants ran back to back), and the ratio of CPU
seconds used by the evaluation's process tree (less sensitive to other load).
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


def evaluation(src: Path, example: Path, confine: str | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the evaluation's whole process tree)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RATCHET_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(src)
    if confine is not None:
        env["RATCHET_CHILD_SANDBOX"] = confine
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "evaluate.py"], cwd=example, env=env, capture_output=True, text=True, timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if "correct: true" not in proc.stdout:
        raise SystemExit(f"evaluation in {example} failed:\n{proc.stdout}\n{proc.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


VARIANTS = ("old", "off", "jail")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rev", default="37751ea", help="git revision of the harness before the confined child")
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    # not under /tmp: the confined child gets a private /tmp, and its interpreter must see
    # the ratchet copy it runs (the warden, isolate_child.py)
    work = Path(tempfile.mkdtemp(prefix=".isolation-bench-", dir=ROOT))
    work.chmod(0o755)  # run as root, the confined child runs as an unprivileged uid and reads kernel.py here
    try:
        old, new = work / "old", work / "new"
        extract(args.rev, old)
        new.mkdir()
        shutil.copytree(ROOT / "src", new / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
        shutil.copytree(ROOT / EXAMPLE, new / EXAMPLE, ignore=shutil.ignore_patterns("__pycache__"))
        for d in (old, new):
            for sub in d.rglob("*"):
                sub.chmod(0o755 if sub.is_dir() else 0o644)
        from ratchet.job import sandbox  # noqa: PLC0415

        print(f"old: harness at {args.rev}; off / jail: this checkout, child unconfined / confined "
              f"(here: {sandbox.choose('auto')}, uid dropped: {os.geteuid() == 0}); {args.reps} interleaved reps")
        print(f"{'kernel setting':<38} {'old s':>7} {'off s':>7} {'jail s':>7} {'jail/old':>8} {'paired':>7} "
              f"{'jail/off':>8} {'paired':>7} {'cpu jail/old':>12}")
        roots = {"old": (old, None), "off": (new, "off"), "jail": (new, "auto")}
        for label, settings in SETTINGS.items():
            source = kernel_source(settings)
            for root in (old, new):
                (root / EXAMPLE / "kernel.py").write_text(source)
            times: dict[str, list[tuple[float, float]]] = {v: [] for v in VARIANTS}
            for rep in range(args.reps):
                order = VARIANTS[rep % 3:] + VARIANTS[: rep % 3]
                for which in order:
                    root, confine = roots[which]
                    times[which].append(evaluation(root / "src", root / EXAMPLE, confine))
            wall = {v: [w for w, _ in times[v]] for v in VARIANTS}
            med = {v: statistics.median(wall[v]) for v in VARIANTS}
            # each rep ran the variants back to back: the median of per-rep ratios is the
            # figure least moved by load that drifts between reps
            paired_old = statistics.median(b / a for a, b in zip(wall["old"], wall["jail"], strict=True))
            paired_off = statistics.median(b / a for a, b in zip(wall["off"], wall["jail"], strict=True))
            cpu = statistics.median(c for _, c in times["jail"]) / statistics.median(c for _, c in times["old"])
            print(f"{label:<38} {med['old']:>7.3f} {med['off']:>7.3f} {med['jail']:>7.3f} {med['jail'] / med['old']:>8.3f} "
                  f"{paired_old:>7.3f} {med['jail'] / med['off']:>8.3f} {paired_off:>7.3f} {cpu:>12.3f}")
            for v in VARIANTS:
                print(f"    {v:>4} wall: {' '.join(f'{t:.2f}' for t in wall[v])}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
