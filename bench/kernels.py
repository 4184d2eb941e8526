"""Kernel harness bench: this CPU's measured peaks, and the CPU example kernel on the roofline.

Runs examples/kernel-cpu/kernel.py (a chunked numpy row-softmax) with its starting
setting CHUNK_ROWS=1 ("before": one numpy call per row) and with the setting a real
`ratchet run` study on a scratch copy of the example kept ("after"), checks
both with ratchet.evaluator.kernels.check, times them interleaved with ratchet.evaluator.kernels.compare,
and places each shape on the roofline. Prints a side-by-side table and records it
(with the command and the machine) in bench/RESULTS.md under "## Kernel harness
(bench/kernels.py), <time>"; the run it replaces moves to bench/HISTORY.md (bench/record.py).

    python bench/kernels.py [--max-time 0.5] [--refresh-peaks] [--no-record]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

import numpy as np
from record import record  # bench/, next to this file

import ratchet.evaluator.kernels as rk

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "kernel-cpu"
BENCHMARK = "Kernel harness (bench/kernels.py)"  # its section's heading in RESULTS.md
SHAPES = [{"rows": 256, "cols": 64}, {"rows": 1024, "cols": 257}, {"rows": 2048, "cols": 512}, {"rows": 512, "cols": 4096}]
BYTES = "2 * rows * cols * itemsize"  # read x, write y: the fused floor
FLOPS = "5 * rows * cols"


def load_kernel():
    """The example's kernel module, loaded from its file (the repo is not a package)."""
    spec = importlib.util.spec_from_file_location("kernel_cpu_example", EXAMPLE / "kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_study(rounds: int) -> tuple[dict, str]:
    """Run a tune study on a scratch copy of the example; return the kept knob values."""
    import shutil
    import subprocess
    import tempfile

    from ratchet.proposers.knobs import find_knob
    from ratchet.store.ledger import Ledger

    work = Path(tempfile.mkdtemp(prefix="ratchet-kernels-bench-")) / "kernel-cpu"
    try:
        shutil.copytree(EXAMPLE, work)
        env = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "b@b",
               "GIT_COMMITTER_NAME": "bench", "GIT_COMMITTER_EMAIL": "b@b"}
        for cmd in (["init", "-q", "-b", "main"], ["add", "-A"], ["commit", "-qm", "task"]):
            subprocess.run(["git", "-C", str(work), *cmd], check=True, env=env)
        ratchet = Path(sys.executable).parent / "ratchet"
        subprocess.run([str(ratchet), "run", "--repo", str(work), "--rounds", str(rounds)],
                       check=True, capture_output=True)
        ledger = Ledger(work / ".ratchet" / "ledger.db")
        incumbent = ledger.get("incumbent")
        cands = ledger.candidates()
        source = subprocess.run(["git", "-C", str(work), "show", f"{incumbent}:kernel.py"],
                                check=True, capture_output=True).stdout
        settings = {name: find_knob(source, name).value for name in ("CHUNK_ROWS", "INPLACE")}
        baseline = cands[0].metric
        line = (f"study: {len(cands)} candidates over {rounds} rounds, time_ms "
                f"{baseline:.2f} -> {ledger.get('incumbent_metric'):.2f}; kept {settings}")
        ledger.close()
        return settings, line
    finally:
        shutil.rmtree(work.parent, ignore_errors=True)


def configured(kernel, settings: dict):
    """softmax with the given knob settings (module attributes set for the call)."""

    def run(x):
        for name, value in settings.items():
            setattr(kernel, name, value)
        return kernel.softmax(x)

    run.__name__ = ",".join(f"{k}={v}" for k, v in settings.items())
    return run


def make_inputs(shape, dtype, rng):
    return rng.standard_normal((shape["rows"], shape["cols"])).astype(dtype)


def reference(x):
    e = np.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-time", type=float, default=0.5, help="seconds per timing (per shape, per pair)")
    parser.add_argument("--refresh-peaks", action="store_true")
    parser.add_argument("--rounds", type=int, default=4, help="rounds of the study (K=2)")
    parser.add_argument("--no-record", action="store_true", help="do not write bench/RESULTS.md")
    args = parser.parse_args()

    started = time.time()
    peaks = rk.measure_peaks(refresh=args.refresh_peaks)
    print(f"device: {peaks.device}")
    print(f"peak bandwidth (copy): {peaks.bandwidth_Bps / 1e9:.2f} GB/s")
    for dtype, flops in sorted(peaks.flops.items()):
        print(f"peak {dtype} matmul: {flops / 1e9:.1f} GFLOP/s")
    print(f"call overhead: {peaks.overhead_s * 1e6:.2f} us")

    kernel = load_kernel()
    before_settings = {"CHUNK_ROWS": 1, "INPLACE": False}
    before = configured(kernel, before_settings)

    # The study: a real `ratchet run` on a scratch copy of the example; "after" is the
    # knob setting of the commit it kept.
    best_settings, study_line = run_study(args.rounds)
    after = configured(kernel, best_settings)
    best_name = after.__name__
    print(study_line)

    rows = []
    for label, fn in (("before", before), ("after", after)):
        report = rk.check(fn, reference, make_inputs, SHAPES, trials=2)
        print(f"{label} ({fn.__name__}): {report.summary()}")
        if not report.ok:
            return 1
    for shape in SHAPES:
        # Both settings are this bench's own code (trusted), timed in this process on
        # fresh inputs per batch; "after" has its timed calls checked as a candidate's are.
        cmp = rk.compare(before, after, make_inputs, shape, reference=reference, max_time_s=args.max_time, names=("before", "after"))
        flops, nbytes = rk.evaluate(FLOPS, shape, "float32"), rk.evaluate(BYTES, shape, "float32")
        pb = rk.assess(cmp.a.median_s, flops, nbytes, peaks, "float32")
        pa = rk.assess(cmp.b.median_s, flops, nbytes, peaks, "float32")
        rows.append((shape, cmp, pb, pa))

    header = "| shape (rows x cols) | floor ms | before ms | before % roof | after ms | after % roof | bound (after) | speedup |"
    lines = [header, "|---|---|---|---|---|---|---|---|"]
    for shape, cmp, pb, pa in rows:
        lines.append(
            f"| {shape['rows']} x {shape['cols']} | {pa.t_min_s * 1e3:.4f} | {cmp.a.median_s * 1e3:.4f} | {pb.pct_of_bound:.1f} | "
            f"{cmp.b.median_s * 1e3:.4f} | {pa.pct_of_bound:.1f} | {pa.bound} | {cmp.speedup:.2f}x |"
        )
    speedup = rk.geomean(c.speedup for _, c, _, _ in rows)
    table = "\n".join(lines)
    print()
    print(table)
    print(f"\ngeomean speedup after/before: {speedup:.2f}x  ({time.time() - started:.0f} s)")

    if not args.no_record:
        command = "python bench/kernels.py" + (f" --max-time {args.max_time}" if args.max_time != 0.5 else "")
        body = [
            f"Device: {peaks.device}, numpy {np.__version__}.",
            "",
            f"Measured peaks (cached, {peaks.measured_at}): copy bandwidth {peaks.bandwidth_Bps / 1e9:.2f} GB/s; "
            + ", ".join(f"{d} matmul {f / 1e9:.1f} GFLOP/s" for d, f in sorted(peaks.flops.items()))
            + f"; call overhead {peaks.overhead_s * 1e6:.2f} us.",
            "",
            f"examples/kernel-cpu softmax (float32), before = `{before.__name__}` (the example's start), "
            f"after = `{best_name}` (the incumbent of a {args.rounds}-round `ratchet run` study, K=2). "
            f"Bytes = {BYTES}; % roof = floor / measured time; fresh inputs every batch, A/B interleaved.",
            "",
            table,
            "",
            f"Geometric-mean speedup: {speedup:.2f}x.",
            "",
        ]
        record(BENCHMARK, command, "\n".join(body))
        print("recorded in bench/RESULTS.md (the previous run moved to bench/HISTORY.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
