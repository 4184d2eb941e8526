import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tmp_path_factory(tmp_path_factory: pytest.TempPathFactory) -> pytest.TempPathFactory:
    """pytest's temporary directories (tmp_path too), searchable by others: run as root, a
    candidate child runs as an unprivileged uid (ratchet.evaluator.isolate) and must be able to read
    a module kept in one. pytest makes them 0700."""
    mktemp = tmp_path_factory.mktemp

    def searchable(*args, **kwargs) -> Path:
        path = mktemp(*args, **kwargs)
        path.chmod(0o755)
        return path

    tmp_path_factory.mktemp = searchable  # type: ignore[method-assign]
    return tmp_path_factory


# --- running side by side (pytest-xdist, `--dist loadgroup`) ------------------------------
# A test runs on any worker unless it shares an expensive fixture: then all its users go to
# one worker, so the fixture is built once. A module- or session-scoped fixture with
# parameters gives one group per parameter (the red-team study per sandbox level), so those
# builds run side by side. Groups and slow tests start first: the suite's wall time is
# bounded by its longest chains, which must not start last.
SHARED_BY_NAME = {"ray_cluster": "ray-cluster"}


def _shared_fixture_group(item: pytest.Item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in info.names_closure:
        if name in SHARED_BY_NAME:
            return SHARED_BY_NAME[name]
    callspec = getattr(item, "callspec", None)
    module = item.nodeid.split("::", 1)[0]
    for name in info.names_closure:
        defs = info.name2fixturedefs.get(name)
        if not defs or defs[-1].scope not in ("module", "package", "session"):
            continue
        if name in ("tmp_path_factory", "worker_id", "testrun_uid"):
            continue
        if callspec is not None and name in callspec.params:
            # xdist drops a group name that ends in "]": the parameter goes first
            return f"{module}:{name}={callspec.params[name]}:"
        if defs[-1].baseid:  # a fixture of ours, not pytest's own
            return module
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # collection happens on the workers
        return
    for item in items:
        group = _shared_fixture_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: (item.get_closest_marker("xdist_group") is None,
                                 item.get_closest_marker("slow") is None))
