"""Killing what a phase left behind (a real subreaper, real processes)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux only")


def test_no_children_sees_a_child_and_its_absence():
    """In a fresh process: the test runner's own children (a cluster a fixture started,
    say) are not this test's to see, let alone to kill."""
    code = textwrap.dedent("""
        import subprocess
        from ratchet.job import procs
        alone = procs._no_children()
        child = subprocess.Popen(["sleep", "30"])
        try:
            seen = not procs._no_children()
            killed = procs.kill_descendants(grace_s=1.0)
        finally:
            child.kill()
            child.wait()
        print(alone, seen, killed, procs._no_children(), procs.kill_descendants())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, check=True)
    assert out.stdout.split() == ["True", "True", "1", "True", "0"], out


def test_a_subreaper_kills_a_daemonised_grandchild():
    """The shell exits at once and its setsid'd sleep is re-parented to the subreaper:
    the fast check must not call that "no children"."""
    code = textwrap.dedent("""
        import subprocess, time
        import psutil
        from ratchet.job import procs
        assert procs.become_subreaper()
        subprocess.run(["sh", "-c", "setsid sleep 30 >/dev/null 2>&1 &"], check=True)
        time.sleep(0.2)  # the orphan is ours now
        orphans = psutil.Process().children()
        print(len(orphans), procs._no_children(), procs.kill_descendants(grace_s=1.0),
              procs._no_children(), not any(p.is_running() for p in orphans))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=30, check=True)
    assert out.stdout.split() == ["1", "False", "1", "True", "True"], out


def test_a_phase_log_is_readable_while_the_phase_runs_and_whole_after(tmp_path):
    """The head of a phase's output reaches its log file as it is printed (the live
    views read a running phase); when the phase ends the file is the capped log."""
    import threading
    import time

    from ratchet.job.procs import run_capped

    log = tmp_path / "logs" / "run.log"
    code = ("import sys, time\nprint('step 0 | loss 4.0', flush=True)\ntime.sleep(1.5)\n"
            "print('x' * 3000, flush=True)\n")
    seen: list[str] = []

    def watch() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not seen:
            if log.exists() and "step 0" in log.read_text():
                seen.append(log.read_text())
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    exit_code, timed_out, capped, _ = run_capped(
        [sys.executable, "-c", code], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
        log_path=log, deadline=time.monotonic() + 30, log_limit=1000,
        reap_all_descendants=False)
    watcher.join()
    assert exit_code == 0 and not timed_out
    assert seen and seen[0] == "step 0 | loss 4.0\n"  # read while the phase slept
    final = log.read_text()
    assert final == capped.text()  # then the capped log: head, marker, tail
    assert final.startswith("step 0 | loss 4.0\n") and "bytes of output dropped]" in final
    assert len(final.encode()) < 1100
