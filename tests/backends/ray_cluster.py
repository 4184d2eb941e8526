"""Session fixture: a real local Ray cluster (2 CPUs, 2 logical GPUs), stopped at the end."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ADDRESS = "http://127.0.0.1:8265"


def _ray() -> str | None:
    exe = Path(sys.executable).parent / "ray"
    return str(exe) if exe.exists() else shutil.which("ray")


@pytest.fixture(scope="session")
def ray_cluster():
    pytest.importorskip("ray.job_submission", reason="needs ray[default]")
    ray = _ray()
    if ray is None:
        pytest.skip("the `ray` CLI is not installed (pip install 'ratchet[ray]')")
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=60)
    start = subprocess.run(
        [ray, "start", "--head", "--num-cpus=2", "--num-gpus=2", "--include-dashboard=true",
         "--dashboard-host=127.0.0.1", "--object-store-memory=500000000",
         "--disable-usage-stats"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    try:
        if start.returncode != 0:
            pytest.skip(f"ray start failed: {start.stderr.strip()[-300:]}")
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + 90
        last = None
        while time.monotonic() < deadline:
            try:  # "No available agent" early on is normal: a trivial job proves it is up
                client = JobSubmissionClient(ADDRESS)
                probe = client.submit_job(entrypoint="true")
                while str(client.get_job_status(probe)) not in ("SUCCEEDED", "FAILED",
                                                               "STOPPED"):
                    time.sleep(0.5)
                break
            except Exception as exc:  # noqa: BLE001
                last = exc
                time.sleep(1)
        else:
            pytest.skip(f"the Ray job server did not answer within 90 s: {last}")
        yield ADDRESS
    finally:
        subprocess.run([ray, "stop", "--force"], env=env, capture_output=True, timeout=120)
