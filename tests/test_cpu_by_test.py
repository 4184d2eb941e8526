"""`make test-cpu`'s plugin bills a test for the CPU of what it started, daemons included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from cpu_by_test import CPUACCT

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(
    not os.access(CPUACCT, os.W_OK), reason="needs a writable cgroup-v1 cpuacct hierarchy (root)")

# The daemon burns one CPU-second, then leaves a mark; the test waits for the mark rather
# than a fixed time, since on a loaded machine a CPU-second takes longer than a wall second.
DAEMON = textwrap.dedent("""
    import pathlib, time
    end = time.process_time() + 1.0
    while time.process_time() < end:
        pass
    pathlib.Path("daemon-done").touch()
""")

TESTS = textwrap.dedent('''
    import os, subprocess, sys, time

    def test_a_daemon_burns_a_second():
        # double-forked: reparented away from this process, invisible to getrusage
        subprocess.run([sys.executable, "-c",
                        "import subprocess, sys; subprocess.Popen("
                        "[sys.executable, 'daemon.py'], start_new_session=True)"],
                       check=True)
        deadline = time.monotonic() + 60
        while not os.path.exists("daemon-done") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists("daemon-done"), "the daemon never finished its CPU-second"

    def test_idle():
        time.sleep(0.2)
''')


def test_a_double_forked_daemons_cpu_counts_for_the_test_that_started_it(tmp_path):
    (tmp_path / "test_sample.py").write_text(TESTS)
    (tmp_path / "daemon.py").write_text(DAEMON)
    out = tmp_path / "cpu"
    env = {**os.environ, "RATCHET_CPU_DIR": str(out),
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist",
                           "-p", "cpu_by_test", "-p", "no:cacheprovider", str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {json.loads(line)["test"].rsplit("::", 1)[1]: json.loads(line)
            for path in out.glob("cpu-*.jsonl") for line in path.read_text().splitlines()}
    assert rows["test_a_daemon_burns_a_second"]["cpu_s"] >= 0.9
    assert rows["test_idle"]["cpu_s"] < 0.5
    summary = subprocess.run([sys.executable, str(ROOT / "scripts" / "suite_cpu.py"), str(out)],
                             capture_output=True, text=True, check=True).stdout
    assert "2 tests" in summary and "test_sample.py" in summary
