import gc
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402

# No progress.png at the end of each `ratchet run` (0.2 CPU-s a run in this process, 0.8 in
# a CLI process, over a few hundred runs): the tests of the chart ask for it
# (tests/handoff_study.py), the tour runs as a user's shell, without this switch.
os.environ.setdefault("RATCHET_PROGRESS_PNG", "0")


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


# One private Ray cluster for the whole session, defined here once: a session-scoped
# fixture imported into several test modules is one fixture per module to pytest, and each
# started a cluster of its own (three, each idling until the session ended).
sys.path.insert(0, str(Path(__file__).parent / "backends"))
import ray_cluster as _ray_cluster_module  # noqa: E402

_cluster_users_left: list[int] = []  # the session's ray-cluster tests not run yet


@pytest.fixture(scope="session", name="ray_cluster")
def ray_cluster():
    """The session's private Ray cluster, stopped after its last user (below), not at the
    session's end: an idle cluster burns about 0.06 CPU-s a second, 40 over a suite."""
    yield from _ray_cluster_module.session_cluster()


def pytest_collection_finish(session: pytest.Session) -> None:
    # A pytest worker holds its ~900 collected tests and every module they imported for the
    # whole session, and the in-process `ratchet` runs allocate a lot: each full collection
    # walked all of it again (about 8% of a worker's CPU in a profile of the side-by-side
    # pass). Collected items are moved out of the collector's sight, and it runs less
    # often (cycles are still collected). Measured on four CLI test files in one process:
    # 7.46 and 7.67 CPU-s of the pytest process before, 7.10 and 7.03 after.
    gc.freeze()
    gc.set_threshold(10_000, 20, 20)
    _cluster_users_left[:] = [sum(_shared_fixture_group(item) == "ray-cluster"
                                  for item in session.items)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    yield
    if _cluster_users_left and _shared_fixture_group(item) == "ray-cluster":
        _cluster_users_left[0] -= 1
        if _cluster_users_left[0] == 0:  # (every user runs on this worker: one xdist group)
            _ray_cluster_module.stop_session_cluster()


def _shared_fixture_group(item: pytest.Item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for name in info.names_closure:
        if name in SHARED_BY_NAME:
            return SHARED_BY_NAME[name]
    if item.get_closest_marker("ray") and not item.get_closest_marker("timing"):
        # a side-by-side Ray test uses the cluster, some by getfixturevalue (test_contract's
        # ray case), which the closure above does not show; the timing pass's Ray tests
        # start clusters of their own or must find none
        return SHARED_BY_NAME["ray_cluster"]
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
    for item in items:  # `make test` collects the timing pass by grep
        if item.get_closest_marker("timing") and \
                "mark.timing" not in Path(str(item.path)).read_text():
            raise pytest.UsageError(
                f"{item.nodeid} is marked timing but its file never says "
                "`mark.timing`: the Makefile's timing pass would miss it")
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # collection happens on the workers
        return
    for item in items:
        group = _shared_fixture_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=lambda item: (item.get_closest_marker("xdist_group") is None,
                                 item.get_closest_marker("slow") is None))
