"""Trusted evaluator (protected): the GELU kernel on the shapes the model really runs.

The shapes and their weights come from `workload.json`, written by `ratchet profile
workload.toml` from the model run under its serving mix (the proposer's copy lacks the
hold-out shapes: the largest of each operator, the long-context tail; the full copy
lives in the study's hidden hold-out directory). The candidate's kernel.py never runs
in this process: it is started in a sandboxed child (`rk.CandidateProcess`).

- the public run: every public shape checked against a float64 reference and timed
  against the model's own GELU (the library op here), ABBA; the study metric is
  `weighted_speedup`, each shape weighted by its calls per forward pass of the mix
  (the model time it stands for), with the Amdahl estimate `model_speedup_est`;
- the hold-out run (`--holdout`, or RATCHET_HOLDOUT set by ratchet's worker): the
  hold-out shapes too, then the dispatch table (the kernel where it won, the library op
  elsewhere), then the model end to end with and without it, at every workload point,
  logits checked against the float64 model (`ratchet.kernels.endtoend`). A kernel whose
  gain does not show up in the model, or that changes its logits, fails here, so it is
  not kept. The metric is `weighted_speedup` over the hold-out shapes.

Run as `python -P evaluate.py` (see docs/kernels.md on -P). Everything is imported before
the candidate starts.
"""

import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

import ratchet.kernels as rk
from ratchet.core.errors import UserError
from ratchet.kernels import endtoend
from ratchet.kernels import workload as wl
from ratchet.kernels.profile import load_model_module, whats_left

HERE = Path(__file__).resolve().parent
OP = "gelu"
TIMING = {"warmup": 1, "min_reps": 4, "max_time_s": float(os.environ.get("MODEL_CPU_SHAPE_S", "0.3")), "verify": 1}
E2E_TIMING = {"max_time_s": float(os.environ.get("MODEL_CPU_E2E_S", "2.0"))}
MARGIN = 0.02  # the kernel must beat the library op by 2% in a bucket to be dispatched there

model = load_model_module(HERE / "model.py", name="model_cpu_model")
library = model.OPS[OP]  # the model's own GELU: the baseline
DEVICE = "cpu"  # the workload's device, set in main()


def reference(x: torch.Tensor) -> torch.Tensor:
    """tanh-GELU in float64 (the harness hands it float64 copies)."""
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def make_inputs(shape: dict, dtype: str, rng: np.random.Generator) -> torch.Tensor:
    x = rng.standard_normal((shape["rows"], shape["cols"]), dtype=np.float32)
    return torch.from_numpy(x).to(device=DEVICE, dtype=getattr(torch, dtype))


def main() -> int:
    holdout = rk.holdout_requested()
    try:
        profile = wl.load_profile(HERE / "workload.json")
        public = wl.op_shapes(profile, OP, holdout=False)
        held = wl.op_shapes(profile, OP, holdout=True) if holdout else []
    except UserError as exc:
        rk.emit({"correct": False, "reason": str(exc)})
        return 0
    if holdout and not held:
        rk.emit({"correct": False, "reason": "the hold-out run found no hold-out shapes: put the full workload.json in the hold-out directory"})
        return 0
    global DEVICE
    DEVICE = profile.workload.get("device", "cpu")
    dtype = profile.workload.get("dtype", "float32")
    threads = profile.workload.get("threads")
    if threads:
        torch.set_num_threads(threads)  # the baseline runs as the model's processes do
    seed = int.from_bytes(os.urandom(4), "little")
    print(f"seed {seed}; {len(public)} public, {len(held)} hold-out shapes of {OP}", file=sys.stderr)
    # the kernel's process gets the model's thread count too (torch reads it at start-up)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)} if threads else None
    with rk.CandidateProcess(HERE / "kernel.py", timeout=120, env=env) as cand:
        report = rk.sweep(cand.function(OP), library, reference, make_inputs, [s.shape for s in public],
                          holdout=[s.shape for s in held], dtypes=(dtype,), bench_options=TIMING, seed=seed,
                          names=("library", "kernel"))
    print(report.table(), file=sys.stderr)
    chosen = held if holdout else public
    metrics = {**report.metrics(), **wl.weighted_metrics(report, chosen, profile, OP)}
    if not holdout or not report.correct:
        rk.emit(metrics)
        return 0
    # The judge's last word: the model itself, with the kernel where it won.
    table = rk.build_dispatch_table(rk.results_from_sweeps({endtoend.KERNEL_IMPL: report}), baseline="library", margin=MARGIN)
    print(rk.dispatch_markdown(table), file=sys.stderr)
    workload = wl.Workload.from_dict(profile.workload, root=HERE)
    expected = wl.weighted_metrics(report, public + held, profile, OP).get("model_speedup_est")
    share = profile.op(OP).share
    e2e = endtoend.end_to_end(workload, [endtoend.Swap(OP, "kernel.py", OP, table)], tree=HERE, timing=E2E_TIMING,
                              expected=expected, bound=1.0 / (1.0 - share) if share < 1 else None, log=endtoend.log_stderr)
    print(e2e.table(), file=sys.stderr)
    print(whats_left(profile, done=[OP]), file=sys.stderr)
    metrics.update(e2e.metrics())
    peak = (profile.peaks or {}).get("flops", {}).get(dtype)
    mfu = e2e.mfu(sum(op.flops for op in profile.ops), peak or 0.0)
    if mfu:
        metrics.update(e2e_mfu_before=mfu[0], e2e_mfu_after=mfu[1])
    if e2e.outcome.rejects:
        metrics.update(correct=False, reason=f"end to end: {e2e.reason}")
    elif e2e.outcome is endtoend.Outcome.FAILED:
        print(f"end to end: {e2e.reason} (the model without the kernel: not the candidate's fault)", file=sys.stderr)
        return 3
    rk.emit(metrics)
    return 0


if __name__ == "__main__":
    sys.exit(main())
