"""Where the suite's CPU goes: each test's CPU-seconds, everything it started included.

A pytest plugin for `make test-cpu` (`-p cpu_by_test`), not loaded by `make test`. At each
test's start its process (the xdist worker) joins a fresh cgroup of the cpuacct hierarchy;
every process it then forks inherits that cgroup, including the double-forked ones (spare
servers, Ray's head, a sandbox's children) that `getrusage` never sees. Wall time says
little on a 2-core machine running four workers: CPU is what the suite is bound by.

A process a test leaves running (a session fixture's cluster) keeps counting into the test
that started it, so a fixture's whole life is billed to its first user: read a group's
tests together. Needs a writable cgroup-v1 cpuacct hierarchy (root); without one the
plugin says so once and records nothing. Rows go to $RATCHET_CPU_DIR (one JSON-lines
file per worker); `scripts/suite_cpu.py DIR` sums them by file.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import warnings
from pathlib import Path

import pytest

CPUACCT = Path("/sys/fs/cgroup/cpuacct")


class CpuByTest:
    def __init__(self, out: Path) -> None:
        self.out = out / f"cpu-{os.getpid()}.jsonl"
        self.rows: list[tuple[str, Path, float]] = []
        self.count = 0

    def _join(self, cgroup: Path) -> None:
        (cgroup / "cgroup.procs").write_text(str(os.getpid()))

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None):
        self.count += 1
        cgroup = CPUACCT / f"ratchet-test-{os.getpid()}-{self.count}"
        cgroup.mkdir()
        self._join(cgroup)
        started = time.monotonic()
        try:
            yield
        finally:
            self._join(CPUACCT)
            self.rows.append((item.nodeid, cgroup, time.monotonic() - started))

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        # read at the end: a process a test left running has counted into it until now
        with self.out.open("a") as fh:
            for nodeid, cgroup, wall in self.rows:
                cpu = int((cgroup / "cpuacct.usage").read_text()) / 1e9
                fh.write(json.dumps({"test": nodeid, "cpu_s": round(cpu, 3),
                                     "wall_s": round(wall, 3)}) + "\n")
                # a process still in it keeps its cgroup (rmdir it once that ends)
                with contextlib.suppress(OSError):
                    cgroup.rmdir()


def pytest_configure(config: pytest.Config) -> None:
    out = Path(os.environ.get("RATCHET_CPU_DIR", "cpu-by-test"))
    probe = CPUACCT / f"ratchet-test-probe-{os.getpid()}"
    try:
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        warnings.warn(f"cpu_by_test: no writable cpuacct cgroup ({exc}); nothing recorded",
                      stacklevel=1)
        return
    out.mkdir(parents=True, exist_ok=True)
    config.pluginmanager.register(CpuByTest(out), "cpu-by-test-recorder")
