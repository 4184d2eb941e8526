"""The slurm preset against a real single-node Slurm (opt-in: RATCHET_TEST_SLURM=1).

Start one with `scripts/slurm_local.sh install && scripts/slurm_local.sh start` (its
config is found through SLURM_CONF, set here from RATCHET_SLURM_DIR when unset).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from tasks import check_holdout_everywhere, make_task, summary

from ratchet.driver.study import Study

pytestmark = pytest.mark.skipif(
    os.environ.get("RATCHET_TEST_SLURM") != "1" or not shutil.which("sbatch"),
    reason="set RATCHET_TEST_SLURM=1 with a running Slurm (scripts/slurm_local.sh start)",
)


@pytest.fixture(autouse=True)
def slurm_conf(monkeypatch):
    conf = Path(os.environ.get("RATCHET_SLURM_DIR", "/tmp/ratchet-slurm")) / "slurm.conf"
    if "SLURM_CONF" not in os.environ and conf.is_file():
        monkeypatch.setenv("SLURM_CONF", str(conf))


def test_study_on_real_slurm(tmp_path):
    extra = "\n".join([
        "[backend.shell]", 'preset = "slurm"', f'stage_dir = "{tmp_path / "stage"}"',
        f'data_dir = "{tmp_path / "shared-data"}"', f'python = "{sys.executable}"',
        "poll = 0.5", 'vars = { sbatch_args = "--cpus-per-task=1" }', ""])
    repo = make_task(tmp_path, backend="shell", parallel=2, rounds=2, sleep=0.2, extra=extra)
    study = Study(repo)
    try:
        study.run()
        cands = study.ledger.candidates()
        assert all(c.extra.get("data_ok") == 1 for c in cands)
        assert all(c.attempt == 0 for c in cands)
    finally:
        study.close()
    rows = summary(repo)
    assert len(rows) == 4 and all(s in ("keep", "discard") for _, s, _, _ in rows), rows


def test_holdout_on_real_slurm(tmp_path, monkeypatch):
    extra = "\n".join([
        "[backend.shell]", 'preset = "slurm"', f'stage_dir = "{tmp_path / "stage"}"',
        f'python = "{sys.executable}"', "poll = 0.5",
        'vars = { sbatch_args = "--cpus-per-task=1" }', ""])
    check_holdout_everywhere(tmp_path, monkeypatch, backend="shell",
                             records=".ratchet/shell/jobs", extra=extra, name="hold",
                             scan=(tmp_path / "stage",))
