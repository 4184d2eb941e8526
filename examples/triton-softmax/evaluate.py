"""Trusted evaluator for the Triton softmax (protected: a candidate may not change it).

Prints `name: value` lines; `speedup` (geometric mean over shapes of torch time / kernel
time) is the study metric, `correct: false` rejects the candidate. Steps:
1. correctness on every shape x dtype against a float64 torch reference (all guards);
2. timing interleaved with torch.softmax (CUDA events + device sync + host cross-check,
   rotating inputs larger than L2);
3. roofline: % of the memory bound, impossible times rejected (peaks measured once and
   cached under $RATCHET_CACHE);
4. end-to-end under CUDA graphs: the kernel captured in a graph must still be right when
   replayed on new values (a kernel left out of the graph would silently do nothing),
   and its graph-replay time is reported for launch-bound shapes.

`--holdout` (or RATCHET_HOLDOUT=1) adds the shapes in holdout.json.
`--quick` runs a reduced sweep (smoke tests); `--dispatch PATH` writes a dispatch table.
`--interpret` (with TRITON_INTERPRET=1) runs tiny shapes on the CPU through Triton's
interpreter: it tests this evaluator and the kernel's logic without a GPU, and its
numbers mean nothing. Exit 77 when there is no CUDA GPU (or, for --interpret, no
interpreter), torch or triton: the evaluation cannot run here.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

SKIP = 77  # "cannot run here" (the autotools skip code), distinct from a failed candidate
HERE = Path(__file__).resolve().parent

PUBLIC = [
    {"rows": 16384, "cols": 128},
    {"rows": 8192, "cols": 512},
    {"rows": 4096, "cols": 1024},
    {"rows": 2048, "cols": 4096},
    {"rows": 1024, "cols": 8192},
    {"rows": 512, "cols": 16384},
    {"rows": 256, "cols": 32768},
]
QUICK = [{"rows": 4096, "cols": 1000}, {"rows": 256, "cols": 32768}]
DTYPES = ["bfloat16", "float16", "float32"]
BYTES = "2 * rows * cols * itemsize"  # read x once, write y once (the fused floor)
FLOPS = "5 * rows * cols"  # max, sub, exp, sum, div per element
INTERPRET = [{"rows": 3, "cols": 100}, {"rows": 2, "cols": 9000}]  # fused and streaming paths
INTERPRET_HOLDOUT = [{"rows": 5, "cols": 333}]
GRAPH_SHAPES = [{"rows": 32, "cols": 1024}, {"rows": 1, "cols": 32768}]  # launch-bound decode-like


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

    # Order matters: torch, then the harness (captures timers), then the candidate.
    import torch

    import ratchet.kernels as rk

    rk.capture_timers()
    sys.path.insert(0, str(HERE))
    import kernel  # noqa: E402 - the candidate, imported only after the timers are captured

    device = torch.device("cpu" if args.interpret else "cuda")

    def make_inputs(shape, dtype, rng):
        g = torch.Generator(device=device).manual_seed(int(rng.integers(2**62)))
        return torch.randn(shape["rows"], shape["cols"], device=device, dtype=getattr(torch, dtype), generator=g)

    def reference(x):
        return torch.softmax(x, dim=-1)  # x arrives upcast to float64

    def baseline(x):
        return torch.softmax(x, dim=-1)

    shapes = INTERPRET if args.interpret else QUICK if args.quick else PUBLIC
    dtypes = ["float32", "bfloat16"] if args.interpret else ["bfloat16"] if args.quick else DTYPES
    # --holdout, or RATCHET_HOLDOUT set by ratchet's worker for the hold-out phase; a copy
    # of holdout.json in that hidden directory (.ratchet/holdout/) wins over this one.
    argv = ["--holdout"] if args.holdout else []
    holdout = rk.load_holdout(INTERPRET_HOLDOUT if args.interpret else HERE / "holdout.json", argv=argv)
    if args.interpret:
        peaks = rk.measure_peaks("cpu")
        timing = {"cache": "warm", "max_time_s": 0.2, "min_reps": 3, "warmup": 1}
    else:
        peaks = rk.measure_peaks("cuda", dtypes=("float32", "float16", "bfloat16"))
        timing = {"cache": "rotate", "max_time_s": 1.0}
    report = rk.sweep(
        kernel.softmax,
        baseline,
        reference,
        make_inputs,
        shapes,
        holdout=holdout,
        dtypes=dtypes,
        flops=FLOPS,
        bytes=BYTES,
        peaks=peaks,
        check_options={"trials": 3},
        bench_options=timing,
        names=("torch", "triton"),
    )
    print(report.table(), file=sys.stderr)

    extra = {"peak_bandwidth_gbs": peaks.bandwidth_Bps / 1e9}
    graph = {"correct": True, "speedup": None, "log": ["graph check skipped: no CUDA in --interpret mode"]}
    if not args.interpret:
        graph = graph_check(torch, rk, kernel.softmax, baseline, make_inputs, reference)
        extra.update(graph_correct=graph["correct"], graph_speedup=graph["speedup"])
    for line in graph["log"]:
        print(line, file=sys.stderr)
    metrics = report.metrics()
    if not graph["correct"]:
        metrics["correct"] = False
        metrics["speedup"] = 0.0
    rk.emit(metrics, extra=extra)
    if args.json:
        Path(args.json).write_text(json.dumps(rk.arrays.jsonable({"report": report.to_dict(), "graph": graph}), indent=2))
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


def graph_check(torch, rk, softmax, baseline, make_inputs, reference) -> dict:
    """Capture the kernel in a CUDA graph, replay on fresh values, compare; then time replay."""
    import numpy as np

    log, correct, speedups = [], True, []
    for shape in GRAPH_SHAPES:
        for dtype in ("bfloat16", "float32"):
            rng = np.random.default_rng(1234)
            static_x = make_inputs(shape, dtype, rng)
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):  # compile/autotune outside the capture
                    softmax(static_x)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_y = softmax(static_x)
            for trial in range(3):
                fresh = make_inputs(shape, dtype, rng) * float(rng.uniform(0.1, 8.0))
                static_x.copy_(fresh)
                static_y.fill_(float("nan"))  # poison: a kernel not in the graph leaves NaN
                graph.replay()
                torch.cuda.synchronize()
                want = reference(fresh.double())
                rtol, atol = rk.tolerance(dtype)
                ok = bool(torch.isfinite(static_y).all()) and torch.allclose(static_y.double(), want, rtol=rtol, atol=atol)
                if not ok:
                    correct = False
                    log.append(f"graph check FAILED: {rk.shape_key(shape)} {dtype} trial {trial}: replayed output wrong or unwritten")
                    break
            cmp = rk.compare(baseline, softmax, (static_x,), cache="warm", cuda_graph=True, max_time_s=0.5, names=("torch", "triton"))
            if not cmp.ok:
                correct = False
                log.extend(cmp.a.reasons + cmp.b.reasons)
            speedups.append(cmp.speedup)
            log.append(
                f"graph {rk.shape_key(shape)} {dtype}: torch {cmp.a.median_s * 1e6:.2f} us, "
                f"triton {cmp.b.median_s * 1e6:.2f} us, speedup {cmp.speedup:.3f}"
            )
    return {"correct": correct, "speedup": rk.geomean(speedups) if correct else 0.0, "log": log}


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    sys.exit(main())
