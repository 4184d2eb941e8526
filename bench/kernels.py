"""Kernel harness bench: this CPU's measured peaks, and the CPU example kernel on the roofline.

Runs examples/kernel-cpu/kernel.py (a chunked numpy row-softmax) with its starting
setting CHUNK_ROWS=1 ("before": one numpy call per row) and with the best setting of
the knob grid its ratchet.toml declares ("after": what a tune study finds), checks
both with ratchet.kernels.check, times them interleaved with ratchet.kernels.compare,
and places each shape on the roofline. Prints a side-by-side table and records it
(with the command) in bench/RESULTS.md under "## Kernel harness (bench/kernels.py)",
replacing only that section.

    python bench/kernels.py [--max-time 0.5] [--refresh-peaks] [--no-record]
"""

from __future__ import annotations

import argparse
import importlib.util
import itertools
import platform
import sys
import time
import tomllib
from pathlib import Path

import numpy as np

import ratchet.kernels as rk

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "kernel-cpu"
RESULTS = ROOT / "bench" / "RESULTS.md"
SECTION = "## Kernel harness (bench/kernels.py)"
SHAPES = [{"rows": 256, "cols": 64}, {"rows": 1024, "cols": 257}, {"rows": 2048, "cols": 512}, {"rows": 512, "cols": 4096}]
BYTES = "2 * rows * cols * itemsize"  # read x, write y: the fused floor
FLOPS = "5 * rows * cols"


def load_kernel():
    """The example's kernel module, loaded from its file (the repo is not a package)."""
    spec = importlib.util.spec_from_file_location("kernel_cpu_example", EXAMPLE / "kernel.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def knob_grid() -> list[dict]:
    """Every combination of the knob choices in the example's ratchet.toml."""
    knobs = tomllib.loads((EXAMPLE / "ratchet.toml").read_text())["tune"]["knobs"]
    names = [k.split(":", 1)[1] for k in knobs]
    choices = [spec["choices"] for spec in knobs.values()]
    return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*choices)]


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

    # "The study": every knob setting, judged by the geometric mean time over the shapes.
    grid = knob_grid()
    scores = {}
    for settings in grid:
        fn = configured(kernel, settings)
        times = []
        for shape in SHAPES:
            x = make_inputs(shape, "float32", np.random.default_rng(0))
            times.append(rk.bench(fn, (x,), cache="warm", max_time_s=args.max_time / 4, min_reps=3, warmup=1).median_s)
        scores[fn.__name__] = (rk.geomean(times), settings)
    best_name, (_, best_settings) = min(scores.items(), key=lambda kv: kv[1][0])
    after = configured(kernel, best_settings)
    print(f"knob grid: {len(grid)} settings; best {best_name}")

    rows = []
    for label, fn in (("before", before), ("after", after)):
        report = rk.check(fn, reference, make_inputs, SHAPES, trials=2)
        print(f"{label} ({fn.__name__}): {report.summary()}")
        if not report.ok:
            return 1
    for shape in SHAPES:
        rng = np.random.default_rng(1)
        cmp = rk.compare(
            before,
            after,
            make_inputs=lambda s=shape, r=rng: (make_inputs(s, "float32", r),),
            cache="rotate",
            max_time_s=args.max_time,
            names=("before", "after"),
        )
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
            SECTION,
            "",
            f"Command: `{command}` — {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
            f"{peaks.device}, Python {platform.python_version()}, numpy {np.__version__}.",
            "",
            f"Measured peaks (cached, {peaks.measured_at}): copy bandwidth {peaks.bandwidth_Bps / 1e9:.2f} GB/s; "
            + ", ".join(f"{d} matmul {f / 1e9:.1f} GFLOP/s" for d, f in sorted(peaks.flops.items()))
            + f"; call overhead {peaks.overhead_s * 1e6:.2f} us.",
            "",
            f"examples/kernel-cpu softmax (float32), before = `{before.__name__}` (the example's start), "
            f"after = `{best_name}` (best of the {len(grid)} knob settings in its ratchet.toml). "
            f"Bytes = {BYTES}; % roof = floor / measured time; cold cache (rotating inputs), A/B interleaved.",
            "",
            table,
            "",
            f"Geometric-mean speedup: {speedup:.2f}x.",
            "",
        ]
        record(RESULTS, "\n".join(body))
        print(f"recorded in {RESULTS.relative_to(ROOT)}")
    return 0


def record(path: Path, section: str) -> None:
    """Replace (or append) only our section; other sections of the file are left alone."""
    text = path.read_text() if path.exists() else "# Bench results\n\n"
    start = text.find(SECTION)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + len(SECTION))
        text = text[:start] + section + ("\n" + text[end + 1 :] if end >= 0 else "")
    path.write_text(text.rstrip("\n") + "\n")


if __name__ == "__main__":
    sys.exit(main())
