"""The example configs under examples/configs/ stay valid for the proposers that read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from ratchet.driver.config import loads_config
from ratchet.proposers.agent import AgentSettings
from ratchet.proposers.context import ContextSettings, validate_section
from ratchet.proposers.llm import load_settings
from ratchet.proposers.patches import PatchesSettings

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"


@pytest.mark.parametrize("name", ["llm", "agent", "patches"])
def test_example_config_is_valid(name):
    config = loads_config((CONFIGS / f"{name}.toml").read_bytes(), f"{name}.toml")
    assert config.search.proposer == name
    validate_section(ContextSettings, config.context, "context")
    if name == "llm":
        settings = load_settings(config)
        assert {m.provider for m in settings.models} == {"openai", "anthropic"}
    elif name == "agent":
        assert validate_section(AgentSettings, config.agent, "agent").argv[0] == "claude"
    else:
        validate_section(PatchesSettings, config.patches, "patches")
    # written for the kernel-cpu example: its editable files exist there
    for path in config.task.editable:
        assert (ROOT / "examples" / "kernel-cpu" / path).is_file()
