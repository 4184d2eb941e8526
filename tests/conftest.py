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
