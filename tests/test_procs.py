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
