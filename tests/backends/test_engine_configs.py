"""The engine configs under examples/configs/ are valid backend sections."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from ratchet.backends.ray_settings import RayConfig
from ratchet.backends.shell import load_shell_config
from ratchet.core.config import section

CONFIGS = Path(__file__).resolve().parents[2] / "examples" / "configs"


def test_ray_example_is_valid():
    data = tomllib.loads((CONFIGS / "ray.toml").read_text())
    assert data["backend"]["kind"] == "ray"
    cfg = section(RayConfig, data["backend"]["ray"], "backend.ray")
    assert cfg.mode == "actors" and cfg.num_gpus == 1


@pytest.mark.parametrize("name", ["slurm", "vessl", "skypilot"])
def test_shell_examples_are_valid(name):
    data = tomllib.loads((CONFIGS / f"{name}.toml").read_text())
    assert data["backend"]["kind"] == "shell"
    cfg = load_shell_config(data["backend"]["shell"])
    assert cfg.preset == name
