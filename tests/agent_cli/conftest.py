"""The real coding-agent CLIs, installed by scripts/install_agent_clis.sh (`make agent-clis`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_cli_kit import LoopbackCA, SandboxLevel, make_ca, sandbox_level


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).parent:
            item.add_marker(pytest.mark.agent_cli)


@pytest.fixture(scope="session")
def test_ca(tmp_path_factory: pytest.TempPathFactory) -> LoopbackCA:
    return make_ca(tmp_path_factory.mktemp("ca"))


@pytest.fixture(params=["bwrap", "pidns"])
def level(request: pytest.FixtureRequest, tmp_path) -> SandboxLevel:
    """Each CLI runs in the agent sandbox with bubblewrap, and as on a machine without it."""
    return sandbox_level(request.param, tmp_path)
