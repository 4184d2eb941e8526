"""The real coding-agent CLIs, installed by scripts/install_agent_clis.sh (`make agent-clis`)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))  # agent_server, helpers

ROOT = TESTS.parent
AGENTS_BIN = ROOT / ".venv-agents" / "bin"


def cli(name: str) -> Path:
    """The installed CLI, or a skip that says how to install it."""
    for candidate in (AGENTS_BIN / name, shutil.which(name)):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    pytest.skip(f"{name} is not installed: run `make agent-clis` "
                f"(scripts/install_agent_clis.sh puts it in .venv-agents/bin)")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.agent_cli)
