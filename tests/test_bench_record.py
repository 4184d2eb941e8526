"""bench/RESULTS.md keeps the latest figure of each benchmark, bench/HISTORY.md every
earlier one verbatim (issue 40): what `--record` does, on copies of the real files."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from helpers import ROOT

sys.path.insert(0, str(ROOT / "bench"))

from record import record, split  # noqa: E402  (bench/record.py)

KERNELS = "Kernel harness (bench/kernels.py)"


@pytest.fixture
def pages(tmp_path):
    results, history = tmp_path / "RESULTS.md", tmp_path / "HISTORY.md"
    shutil.copy(ROOT / "bench" / "RESULTS.md", results)
    shutil.copy(ROOT / "bench" / "HISTORY.md", history)
    return results, history


def test_every_kept_figure_names_its_command_date_and_machine():
    _, sections = split((ROOT / "bench" / "RESULTS.md").read_text())
    assert len(sections) >= 10
    for section in sections:
        heading = section.splitlines()[0]
        assert "(bench/" in heading and "20" in heading, heading  # the script, the date
        assert "ommand" in section or "`python bench/" in section, heading
        assert "Machine:" in section or "AMD EPYC" in section or "Intel Xeon" in section, heading


def test_a_recorded_run_replaces_its_benchmark_and_the_old_one_moves_verbatim(pages):
    results, history = pages
    _, before = split(results.read_text())
    (old,) = [s for s in before if s.startswith(f"## {KERNELS}")]
    new = record(KERNELS, "python bench/kernels.py", "| shape | ms |\n|---|---|\n| 256 x 64 | 0.13 |",
                 results=results, history=history, now=0)
    header, after = split(results.read_text())
    assert header.startswith("# Bench results")
    assert after[0] == new and new.startswith(f"## {KERNELS}, 1970-01-01 00:00 UTC")
    assert "Command: `python bench/kernels.py`" in new and "Machine: " in new
    assert [s for s in after if s.startswith(f"## {KERNELS}")] == [new]  # one figure only
    assert after[1:] == [s for s in before if s != old]  # the others untouched
    _, past = split(history.read_text())
    assert past[0] == old  # moved, verbatim, newest first


def test_a_new_benchmark_moves_nothing(pages):
    results, history = pages
    past = history.read_text()
    record("Fan-out (bench/fanout.py --sleep 1)", "python bench/fanout.py --sleep 1 --record",
           "ratio **3.8**", results=results, history=history)
    assert history.read_text() == past
    assert split(results.read_text())[1][0].startswith("## Fan-out (bench/fanout.py --sleep 1), ")


@pytest.mark.parametrize("script", ["fanout.py", "distributed.py", "throughput.py", "kernels.py"])
def test_the_recording_benches_start(script):
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--help"],
                          capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    assert "RESULTS.md" in proc.stdout
