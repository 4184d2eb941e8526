"""examples/triton-softmax: skips cleanly without a GPU; its config and kernel are sound."""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "triton-softmax"


def test_evaluate_skips_with_code_77_without_a_gpu():
    pytest.importorskip("numpy")
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is present: bench/gpu_check.sh runs the real evaluation")
    except ImportError:
        pass
    proc = subprocess.run([sys.executable, "evaluate.py"], cwd=EXAMPLE, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 77, proc.stderr
    assert proc.stderr.startswith("SKIP: triton-softmax evaluation needs a CUDA GPU")
    assert "correct:" not in proc.stdout  # no metric lines: nothing was measured


def test_config_names_existing_literal_knobs_and_protects_the_evaluator():
    cfg = tomllib.loads((EXAMPLE / "ratchet.toml").read_text())
    assert cfg["task"]["editable"] == ["kernel.py"]
    assert {"evaluate.py", "holdout.json"} <= set(cfg["task"]["protected"])
    assert cfg["task"]["metric"] == {"name": "speedup", "goal": "maximize"}
    tree = ast.parse((EXAMPLE / "kernel.py").read_text())
    literals = {
        node.targets[0].id: node.value.value
        for node in tree.body
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Constant)
    }
    for knob, spec in cfg["tune"]["knobs"].items():
        path, name = knob.split(":")
        assert path == "kernel.py" and name in literals, knob
        assert literals[name] in spec["choices"], f"{name}={literals[name]} not among its choices"


def _evaluator():
    spec = importlib.util.spec_from_file_location("triton_softmax_evaluate", EXAMPLE / "evaluate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # top level imports only the stdlib: torch/triton come in main()
    return module


def test_holdout_shapes_are_disjoint_from_public_and_reach_long_contexts():
    holdout = json.loads((EXAMPLE / "holdout.json").read_text())["shapes"]
    public = _evaluator().PUBLIC
    assert not {json.dumps(s, sort_keys=True) for s in holdout} & {json.dumps(s, sort_keys=True) for s in public}
    assert max(s["cols"] for s in public) >= 32768 and min(s["cols"] for s in public) <= 1024


def test_shapes_span_launch_bound_decode_and_bandwidth_bound_prefill():
    ev = _evaluator()
    # decode rows: well under a MiB of traffic even in fp32 (launch-bound on any GPU)
    assert all(2 * s["rows"] * s["cols"] * 4 <= 4 << 20 for s in ev.DECODE)
    # prefill: hundreds of MB per tensor in bf16 already
    assert all(s["rows"] * s["cols"] * 2 >= 128 << 20 for s in ev.PREFILL)
    assert ev.PUBLIC == ev.DECODE + ev.PREFILL


def test_kernel_writes_into_the_buffer_it_is_given_and_falls_back_to_torch():
    tree = ast.parse((EXAMPLE / "kernel.py").read_text())
    softmax = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "softmax")
    assert [a.arg for a in softmax.args.args] == ["x", "out"]
    assert "TORCH_FALLBACK" in (EXAMPLE / "kernel.py").read_text()


def test_evaluator_end_to_end_in_the_triton_interpreter(tmp_path):
    """evaluate.py with the real Triton kernel on CPU (TRITON_INTERPRET=1): every step but
    CUDA graphs runs, through ratchet.evaluator.kernels; the numbers mean nothing, the flow does."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    from ratchet.evaluator.kernels import Peaks, device_name, save_peaks

    # cached peaks (generous, so no floor can trip) spare the run a measurement
    save_peaks(Peaks(device=device_name("cpu"), bandwidth_Bps=1e12, flops={"float32": 1e13}, overhead_s=1e-6), tmp_path / "cache" / "peaks.json")
    env = {**os.environ, "TRITON_INTERPRET": "1", "RATCHET_CACHE": str(tmp_path / "cache")}
    env.pop("RATCHET_HOLDOUT", None)
    argv = [sys.executable, "evaluate.py", "--interpret", "--holdout", "--json", str(tmp_path / "r.json"), "--dispatch", str(tmp_path / "d.json")]
    proc = subprocess.run(argv, cwd=EXAMPLE, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert metrics["correct"] == "true", proc.stderr[-3000:]
    assert metrics["shapes"] == "6" and metrics["shapes_failed"] == "0"  # 2 public + 1 hold-out, x 2 dtypes
    assert "speedup_sem" in metrics and "interpret_speedup" in metrics
    assert float(metrics["speedup"]) > 0 and "holdout_speedup" in metrics
    report = json.loads((tmp_path / "r.json").read_text())["report"]
    assert {r["dtype"] for r in report["results"]} == {"float32", "bfloat16"}
    assert all(r["check"]["ok"] and r["roofline"] and r["verified_calls"] for r in report["results"])
    table = json.loads((tmp_path / "d.json").read_text())
    assert table["baseline"] == "torch" and len(table["buckets"]) == 6
    assert (tmp_path / "cache" / "peaks.json").is_file()


def test_interpret_mode_without_the_interpreter_skips():
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "evaluate.py", "--interpret"], cwd=EXAMPLE, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 77 and "TRITON_INTERPRET=1" in proc.stderr


STAND_IN_KERNEL = '''
import torch


def softmax(x, out=None):
    """A torch stand-in with the Triton kernel's interface (no triton needed)."""
    if out is None:
        out = torch.empty_like(x)
    out.copy_(torch.softmax(x.float(), -1).to(x.dtype))
    return out
'''


def test_evaluator_flow_with_a_stand_in_kernel(tmp_path):
    """The evaluator's whole flow on the CPU, triton or not: the example's evaluate.py and
    holdout.json with a torch stand-in for kernel.py, run in --interpret mode (an empty
    `triton` package satisfies the evaluator's own availability check; the candidate child
    never sees it: it ignores PYTHONPATH)."""
    pytest.importorskip("torch")
    from ratchet.evaluator.kernels import Peaks, device_name, save_peaks

    example = tmp_path / "ex"
    example.mkdir()
    for name in ("evaluate.py", "holdout.json"):
        (example / name).write_bytes((EXAMPLE / name).read_bytes())
    (example / "kernel.py").write_text(STAND_IN_KERNEL)
    (tmp_path / "fake" / "triton").mkdir(parents=True)
    (tmp_path / "fake" / "triton" / "__init__.py").write_text("")
    save_peaks(Peaks(device=device_name("cpu"), bandwidth_Bps=1e12, flops={"float32": 1e13}, overhead_s=1e-6), tmp_path / "cache" / "peaks.json")
    env = {**os.environ, "TRITON_INTERPRET": "1", "RATCHET_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(tmp_path / "fake")}
    env.pop("RATCHET_HOLDOUT", None)
    argv = [sys.executable, "evaluate.py", "--interpret", "--holdout", "--json", str(tmp_path / "r.json"), "--dispatch", str(tmp_path / "d.json")]
    proc = subprocess.run(argv, cwd=example, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert metrics["correct"] == "true", proc.stderr[-3000:]
    assert metrics["shapes"] == "6" and metrics["shapes_failed"] == "0"
    assert {"speedup_sem", "interpret_speedup", "holdout_speedup", "host_overhead_us"} <= set(metrics)
    report = json.loads((tmp_path / "r.json").read_text())["report"]
    assert all(r["check"]["ok"] and r["roofline"]["bound"] in ("overhead", "memory", "compute") for r in report["results"])
    assert json.loads((tmp_path / "d.json").read_text())["baseline"] == "torch"
