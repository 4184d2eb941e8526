"""One driver per study: a second `ratchet run` names the holder and exits non-zero; a
lock left by a dead driver is taken over.
"""

from __future__ import annotations

import signal

from common import deterministic_repo, ledger, start_run, wait_no_processes, wait_until
from helpers import ratchet


def has_submitted(repo) -> bool:
    if not (repo / ".ratchet" / "ledger.db").exists():
        return False
    db = ledger(repo)
    try:
        return any(c.status == "submitted" for c in db.candidates())
    finally:
        db.close()


def test_second_driver_names_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path):
    repo = deterministic_repo(tmp_path / "r", rounds=2, sleep=1.5)
    first = start_run(repo)
    wait_until(lambda: has_submitted(repo), what="the first driver's jobs")

    second = ratchet(repo, "run", timeout=60)
    assert second.returncode != 0
    assert f"study is locked by pid {first.pid} on " in second.stderr, second.stderr
    assert "Traceback" not in second.stderr
    assert first.poll() is None  # the holder was not disturbed

    # the holder dies without releasing anything; its note stays in the lock file
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert f"pid {first.pid}" in (repo / ".ratchet" / "lock").read_text()

    third = ratchet(repo, "run", timeout=120)
    assert third.returncode == 0, third.stderr
    assert "locked" not in third.stderr
    db = ledger(repo)
    cands = db.candidates()
    db.close()
    assert len(cands) == 4 and all(c.is_judged for c in cands)
    assert all(c.attempt == 0 for c in cands)  # the dead driver's jobs were reattached
    assert wait_no_processes(tmp_path) == []


def test_a_stale_lock_file_does_not_block(tmp_path):
    repo = deterministic_repo(tmp_path / "r", rounds=1)
    (repo / ".ratchet").mkdir()
    (repo / ".ratchet" / "lock").write_text("pid 999999 on elsewhere since yesterday\n")
    proc = ratchet(repo, "run", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "pid 999999" not in (repo / ".ratchet" / "lock").read_text()
