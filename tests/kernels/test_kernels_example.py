"""examples/triton-softmax: skips cleanly without a GPU; its config and kernel are sound."""

from __future__ import annotations

import ast
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


def test_holdout_shapes_are_disjoint_from_public_and_reach_long_contexts():
    holdout = json.loads((EXAMPLE / "holdout.json").read_text())["shapes"]
    source = (EXAMPLE / "evaluate.py").read_text()
    public = ast.literal_eval(source.split("PUBLIC = ", 1)[1].split("\n]\n", 1)[0] + "\n]")
    assert not {json.dumps(s, sort_keys=True) for s in holdout} & {json.dumps(s, sort_keys=True) for s in public}
    assert max(s["cols"] for s in public) >= 32768 and min(s["cols"] for s in public) <= 128


def test_triton_kernel_is_correct_in_the_interpreter():
    """Runs the real Triton kernel through ratchet.kernels.check on CPU (TRITON_INTERPRET=1)."""
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    script = """
import torch, ratchet.kernels as rk
rk.capture_timers()
import kernel
def make(shape, dtype, rng):
    g = torch.Generator().manual_seed(int(rng.integers(2**62)))
    return torch.randn(shape["rows"], shape["cols"], generator=g, dtype=getattr(torch, dtype))
shapes = [{"rows": 3, "cols": 100}, {"rows": 2, "cols": 9000}]  # fused and streaming kernels
r = rk.check(kernel.softmax, lambda x: torch.softmax(x, -1), make, shapes, dtypes=("float32", "bfloat16"), trials=2)
print(r.summary())
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-c", script], cwd=EXAMPLE, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "correctness: 4/4 cases ok", proc.stdout
