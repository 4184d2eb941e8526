"""A backend defined only here, by one class and its settings model, runs a whole study.

Nothing of ratchet is edited to add it: the registry makes `[backend] kind = "recording"`
valid, checks `[backend.recording]` against its model (with the same one-line errors as
every other key) and hands the backend its typed settings.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import score_repo
from pydantic import BaseModel, ConfigDict

from ratchet import backends
from ratchet.backends import make_backend, register_backend
from ratchet.backends.local import LocalBackend
from ratchet.core.config import Backend as BackendSection
from ratchet.core.config import ConfigError
from ratchet.driver.config import load_config
from ratchet.driver.study import Study
from ratchet.job.jobspec import JobSpec


class RecordingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    label: str
    placed: Path  # every job placed is appended here


class RecordingBackend(LocalBackend):
    """This machine's backend, writing down each job it places."""

    def __init__(self, state_dir: Path, settings: RecordingSettings,
                 backend: BackendSection) -> None:
        super().__init__(state_dir, backend=backend)
        self.settings = settings

    def submit(self, spec: JobSpec) -> str:
        with self.settings.placed.open("a") as fh:
            fh.write(spec.job_id + "\n")
        return super().submit(spec)

    def describe(self) -> str:
        return f"recording {self.settings.label}: {super().describe()}"


@pytest.fixture
def recording():
    register_backend("recording", settings=RecordingSettings,
                     summary="test: the local backend, writing down what it places")(
                         RecordingBackend)
    yield
    backends._REGISTRY.pop("recording")


def _repo(tmp_path: Path, table: str) -> Path:
    return score_repo(tmp_path / "r", backend='[backend]\nkind = "recording"\nslots = 2\n' + table,
                      search='[search]\nproposer = "tune"\nparallel = 2\nrounds = 2\n')


def test_a_backend_of_one_class_and_a_settings_model_runs_a_study(tmp_path, recording):
    placed = tmp_path / "placed.txt"
    repo = _repo(tmp_path, f'[backend.recording]\nlabel = "lab"\nplaced = "{placed}"\n')
    study = Study(repo)
    try:
        assert isinstance(study.backend, RecordingBackend)
        assert study.backend.describe().startswith("recording lab: local: 2 slots")
        study.run()
        cands = study.ledger.candidates()
    finally:
        study.close()
    assert {c.status for c in cands} <= {"keep", "discard", "reference"}
    jobs = placed.read_text().split()  # every job the study placed (confirmations too)
    assert len(jobs) == len(set(jobs))
    assert {c.job_id for c in cands if c.job_id} <= set(jobs)


def test_its_table_is_checked_like_every_other_key(tmp_path, recording):
    repo = _repo(tmp_path, '[backend.recording]\nlabell = "x"\nplaced = "p"\n')
    with pytest.raises(ConfigError, match=r"backend\.recording\.labell: unknown key; did you "
                                          r"mean 'label'\?"):
        load_config(repo)


def test_a_missing_table_names_the_key_it_needs(tmp_path, recording):
    config = load_config(_repo(tmp_path, ""))
    with pytest.raises(ConfigError, match=r"backend\.recording\.label: required key is "
                                          r"missing \(add a \[backend\.recording\] table\)"):
        make_backend("recording", tmp_path / "state", config.backend)


def test_an_unknown_kind_lists_every_registered_backend(tmp_path, recording):
    repo = score_repo(tmp_path / "r", backend='[backend]\nkind = "recordin"\n')
    with pytest.raises(ConfigError, match=r"backend\.kind: unknown backend 'recordin'; did you "
                                          r"mean 'recording'\? \(expected local \| ray \| shell "
                                          r"\| recording\)"):
        load_config(repo)


def test_the_built_in_backends_are_in_the_registry_with_their_models():
    from ratchet.backends.ray_settings import RayConfig
    from ratchet.backends.shell import ShellConfig

    found = backends.backends()
    assert list(found)[:3] == ["local", "ray", "shell"]
    assert found["ray"].settings is RayConfig and found["shell"].settings is ShellConfig
    assert found["local"].factory is LocalBackend
