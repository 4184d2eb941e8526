"""Trusted evaluator for the Triton softmax (protected: a candidate may not change it).

Reports `speedup` (geometric mean over shapes of torch time / kernel time; the study
metric), `speedup_sem`, `correct` and per-class figures through ratchet's trusted channel.
kernel.py is never imported here: it runs in a child process (`rk.CandidateProcess`) and
fills output buffers this process owns (CUDA IPC); the checks, the clock, torch's
baseline, the float64 reference and the roofline stay here. Two shape classes:

- DECODE: launch-bound rows (a few rows, decode-time attention scores), timed the way
  serving stacks run them: N calls captured in one CUDA graph (the child captures, this
  process times the replay), every replay's outputs poisoned before and checked after;
- PREFILL: bandwidth-bound tensors of hundreds of MB, timed as N back-to-back calls with
  a device-wide synchronize, inputs refilled between batches.

Then the roofline: % of the memory bound and the bottleneck (overhead / memory /
compute) per shape; a time above 110% of the measured peak is impossible and rejected
(peaks measured once and cached under $RATCHET_CACHE).

`--holdout` (or RATCHET_HOLDOUT set by ratchet's worker) adds the shapes in holdout.json.
`--quick` runs a reduced sweep (smoke tests); `--dispatch PATH` writes a dispatch table;
`--json PATH` the full report. `--interpret` (with TRITON_INTERPRET=1) runs tiny shapes on
the CPU through Triton's interpreter: it tests this evaluator and the kernel's logic
without a GPU, and its numbers mean nothing. Exit 77 when there is no CUDA GPU (or, for
--interpret, no interpreter), torch or triton: the evaluation cannot run here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SKIP = 77  # "cannot run here" (the autotools skip code), distinct from a failed candidate
HERE = Path(__file__).resolve().parent

# Launch-bound: microseconds of memory traffic, dominated by the per-call launch cost.
DECODE = [
    {"rows": 1, "cols": 32768},
    {"rows": 8, "cols": 4096},
    {"rows": 32, "cols": 1024},
    {"rows": 64, "cols": 8192},
]
# Bandwidth-bound: 128-512 MiB per tensor (16384 x 8192 bf16 is 256 MiB in, 256 MiB out).
PREFILL = [
    {"rows": 16384, "cols": 8192},
    {"rows": 65536, "cols": 1024},
    {"rows": 4096, "cols": 32768},
]
PUBLIC = DECODE + PREFILL
QUICK_DECODE = [{"rows": 32, "cols": 1024}]
QUICK_PREFILL = [{"rows": 16384, "cols": 8192}]
DTYPES = ["bfloat16", "float16", "float32"]
BYTES = "2 * rows * cols * itemsize"  # read x once, write y once (the fused floor)
FLOPS = "5 * rows * cols"  # max, sub, exp, sum, div per element
INTERPRET = [{"rows": 3, "cols": 100}, {"rows": 2, "cols": 9000}]  # fused and streaming paths
INTERPRET_HOLDOUT = [{"rows": 5, "cols": 333}]
LAUNCH_BOUND_ROWS = 256  # hold-out shapes with at most this many rows are timed like DECODE


def unavailable(interpret: bool) -> str | None:
    """Why this machine cannot run the evaluation, or None."""
    if interpret and os.environ.get("TRITON_INTERPRET") != "1":
        return "--interpret needs TRITON_INTERPRET=1 in the environment"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not interpret and not torch.cuda.is_available():
        return "no CUDA GPU visible to torch"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--holdout", action="store_true", help="add the hold-out shapes")
    parser.add_argument("--quick", action="store_true", help="reduced sweep for smoke tests")
    parser.add_argument("--dispatch", metavar="PATH", help="write a dispatch table (kernel vs torch) here")
    parser.add_argument("--json", metavar="PATH", help="also write the full report as JSON here")
    parser.add_argument("--interpret", action="store_true", help="CPU + Triton interpreter, tiny shapes (tests only)")
    args = parser.parse_args()

    why = unavailable(args.interpret)
    if why:
        print(f"SKIP: triton-softmax evaluation needs a CUDA GPU with torch and triton: {why}", file=sys.stderr)
        return SKIP

    import torch

    import ratchet.kernels as rk

    device = torch.device("cpu" if args.interpret else "cuda")

    def make_inputs(shape, dtype, rng):
        g = torch.Generator(device=device).manual_seed(int(rng.integers(2**62)))
        return torch.randn(shape["rows"], shape["cols"], device=device, dtype=getattr(torch, dtype), generator=g)

    def reference(x):
        return torch.softmax(x, dim=-1)  # x arrives upcast to float64

    def baseline(x):
        return torch.softmax(x, dim=-1)

    def out_buffer(shape, dtype, inputs):
        return torch.empty_like(inputs[0])

    argv = ["--holdout"] if args.holdout else []
    # --holdout, or RATCHET_HOLDOUT set by ratchet's worker for the hold-out phase; a copy
    # of holdout.json in that hidden directory (.ratchet/holdout/) wins over this one.
    holdout = rk.load_holdout(INTERPRET_HOLDOUT if args.interpret else HERE / "holdout.json", argv=argv)
    if args.interpret:
        peaks = rk.measure_peaks("cpu")
        classes = [("interpret", INTERPRET, [s for s in holdout], False)]
        dtypes = ["float32", "bfloat16"]
        timing = {"max_time_s": 0.2, "min_reps": 3, "warmup": 1}
    else:
        peaks = rk.measure_peaks("cuda", dtypes=("float32", "float16", "bfloat16"))
        decode, prefill = (QUICK_DECODE, QUICK_PREFILL) if args.quick else (DECODE, PREFILL)
        classes = [
            ("decode", decode, [s for s in holdout if s["rows"] <= LAUNCH_BOUND_ROWS], True),
            ("prefill", prefill, [s for s in holdout if s["rows"] > LAUNCH_BOUND_ROWS], False),
        ]
        dtypes = ["bfloat16"] if args.quick else DTYPES
        timing = {"max_time_s": 1.0, "min_reps": 10, "warmup": 2, "target_sem": 0.005}

    report = rk.SweepReport(candidate="triton", baseline="torch")
    per_class = {}
    with rk.CandidateProcess(HERE / "kernel.py", timeout=600) as cand:
        softmax = cand.function("softmax")
        for name, shapes, hold, graphs in classes:
            part = rk.sweep(
                softmax, baseline, reference, make_inputs, shapes,
                holdout=hold, dtypes=dtypes, flops=FLOPS, bytes=BYTES, peaks=peaks,
                check_options={"trials": 2, "out": out_buffer},
                bench_options={**timing, "cuda_graph": graphs},
                names=("torch", "triton"),
            )
            report.results += part.results
            per_class[name] = part
        print(f"candidate log:\n{cand.log_tail()}", file=sys.stderr)
    print(report.table(), file=sys.stderr)

    extra = {"peak_bandwidth_gbs": peaks.bandwidth_Bps / 1e9}
    for name, part in per_class.items():
        if part.results:
            extra[f"{name}_speedup"] = part.geomean_speedup()
    rk.emit(report, extra=extra)
    if args.json:
        Path(args.json).write_text(json.dumps(rk.arrays.jsonable({"report": report.to_dict(), "peaks": peaks.to_dict()}), indent=2))
    if args.dispatch:
        table = rk.build_dispatch_table(
            rk.results_from_sweeps({"triton": report}),
            baseline="torch",
            dims=["cols"],
            margin=0.02,
            device=rk.device_name(device.type),
        )
        rk.write_dispatch(table, args.dispatch)
        print(rk.dispatch_markdown(table), file=sys.stderr)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
