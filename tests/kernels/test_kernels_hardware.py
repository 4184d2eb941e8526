"""hardware_context(), hardware.md and model.md."""

from __future__ import annotations

import json

from ratchet.evaluator.kernels import (
    MODEL_MD_TEMPLATE,
    hardware_context,
    hardware_markdown,
    llc_bytes,
    write_model_md,
)
from ratchet.evaluator.kernels.hardware import _parse_size


def test_context_reads_this_machine():
    ctx = hardware_context()
    json.dumps(ctx)
    cpu = ctx["cpu"]
    assert cpu["logical_cpus"] >= 1 and cpu["model"]
    assert "numpy" in ctx["libraries"]
    assert isinstance(ctx["gpus"], list)
    if cpu["caches"]:
        assert llc_bytes() == max(c["size_bytes"] for c in cpu["caches"] if c["level"] == max(x["level"] for x in cpu["caches"]))


def test_sizes_parse():
    assert _parse_size("32768K") == 32 << 20
    assert _parse_size("1 MiB") == 1 << 20
    assert _parse_size("512 KB") == 512 << 10
    assert _parse_size("garbage") is None


def test_markdown_from_a_given_context():
    ctx = {
        "cpu": {"model": "Test CPU", "arch": "x86_64", "logical_cpus": 4, "simd": ["avx2"], "caches": [{"level": 3, "type": "Unified", "size_bytes": 32 << 20}]},
        "gpus": [{"index": 0, "name": "Test GPU", "memory_bytes": 80 << 30, "compute_capability": "9.0", "sm_count": 132, "features": {"tma": True, "fp8": True, "wgmma": True, "bf16": True}}],
        "libraries": {"numpy": "2.0"},
    }
    text = hardware_markdown(ctx, peaks=[])
    assert "- model: Test CPU (x86_64)" in text
    assert "- L3 unified cache: 32.0 MiB" in text
    assert "cuda:0: Test GPU, compute capability 9.0, 132 SMs, memory 80.0 GiB" in text
    assert "has: tma, fp8, wgmma, bf16" in text
    assert "not measured yet" in text


def test_model_md_template_never_overwrites(tmp_path):
    path = write_model_md(tmp_path / "model.md")
    assert path.read_text() == MODEL_MD_TEMPLATE
    path.write_text("my facts")
    write_model_md(path)
    assert path.read_text() == "my facts"
