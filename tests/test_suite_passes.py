"""`make test`'s timing pass collects only the files that name its marker (a grep in the
Makefile): tests/conftest.py refuses a marked test whose file never does."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def collect(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_sample.py").write_text(body)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"),
                                                         os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only",
                           "-p", "conftest", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_a_marker_the_makefiles_grep_would_miss_stops_the_run(tmp_path):
    proc = collect(tmp_path, 'import pytest\n'
                             'pytestmark = [getattr(pytest.mark, "tim" + "ing")]\n'
                             'def test_x():\n    pass\n')
    assert proc.returncode != 0
    assert "is marked timing but its file never says `mark.timing`" in proc.stdout + proc.stderr


def test_a_marker_written_out_is_collected(tmp_path):
    proc = collect(tmp_path, 'import pytest\n'
                             '@pytest.mark.timing\n'
                             'def test_x():\n    pass\n')
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 test collected" in proc.stdout


def test_the_makefiles_timing_pass_names_its_files():
    """`make -n test`: the timing pass runs on the files that name its marker (an empty
    list would collect every test file, ~6 CPU-s a pytest process)."""
    proc = subprocess.run(["make", "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "MAKEFLAGS": ""})
    assert proc.returncode == 0, proc.stderr
    [line] = [x for x in proc.stdout.splitlines() if " -m timing " in x]
    assert "tests/test_slots.py" in line.split(), line
    # test modules only: a conftest.py named there is collected as a test module, and
    # pytest stops on the two conftest modules of one name (it did at stop 48)
    assert not [arg for arg in line.split() if arg.endswith("conftest.py")], line
