"""Fast unit tests of the pure parts: reading an evaluation, env scrubbing, data digests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from helpers import ROOT

from ratchet.job import sandbox
from ratchet.job.jobspec import (
    CHANNEL,
    STDOUT,
    JobResult,
    collect_metrics,
    declared_env_names,
    scrub_env,
    worker_env,
)
from ratchet.job.prep import data_digest, ensure_intact, make_readonly


def reading(channel=b"", log="", filed=None):
    return collect_metrics(channel=channel, log_text=log, result_file=filed,
                           critical={"time_ms", "correct"})


def test_channel_values_win_and_an_echo_agrees():
    r = reading(b'{"time_ms": 1.5, "correct": true}\n', "time_ms: 1.5\ncorrect: true\n")
    assert r.source == CHANNEL and r.metrics == {"time_ms": 1.5, "correct": True}
    assert r.tampering == []


def test_a_printed_line_disagreeing_with_the_channel_is_tampering():
    r = reading(b'{"time_ms": 1.5}\n', "time_ms: 1.5\ntime_ms: 0.001\n")
    assert r.tampering and "disagrees with the trusted channel" in r.tampering[0]


def test_result_file_never_overrides():
    r = reading(b'{"time_ms": 1.5}\n', "", {"time_ms": 0.1})
    assert "$RATCHET_RESULT time_ms" in r.tampering[0]
    r = reading(b"", "time_ms: 2\n", {"time_ms": 0.1})
    assert r.source == STDOUT and r.tampering
    r = reading(b"", "time_ms: 2\n", {"extra_thing": 3})
    assert r.metrics == {"time_ms": 2.0, "extra_thing": 3} and not r.tampering


def test_stdout_only_duplicates():
    assert reading(log="time_ms: 2\ntime_ms: 1\n").tampering  # critical: rejected
    r = reading(log="time_ms: 2\nloss: 3\nloss: 2\nstep: 1\nstep: 1\n")
    assert not r.tampering and r.dropped == ["loss"] and r.metrics["step"] == 1.0


def test_channel_garbage_and_nan():
    assert reading(b"not json\n").tampering
    r = reading(b'{"time_ms": NaN}\n', "time_ms: nan\n")
    assert not r.tampering


def test_channel_module_end_to_end():
    read, write = os.pipe()
    code = ("import os, subprocess, sys\nfrom ratchet import channel\n"
            "assert 'RATCHET_METRICS_FD' not in os.environ\n"
            "assert not os.get_inheritable(int(sys.argv[1]))\n"
            "channel.report({'time_ms': 0.1 + 0.2, 'correct': True, 'kind': 'memory'})\n")
    proc = subprocess.run([sys.executable, "-c", code, str(write)], pass_fds=[write],
                          env={**os.environ, "RATCHET_METRICS_FD": str(write)},
                          capture_output=True, text=True, timeout=60)
    os.close(write)
    assert proc.returncode == 0, proc.stderr
    data = os.read(read, 65536)
    os.close(read)
    assert json.loads(data) == {"time_ms": 0.30000000000000004, "correct": True, "kind": "memory",
                                "ratchet:seq": 1, "ratchet:echo": True}
    r = collect_metrics(channel=data, log_text=proc.stdout, result_file=None,
                        critical={"time_ms"})
    assert not r.tampering and r.metrics["time_ms"] == 0.1 + 0.2


def test_declared_key_names_are_denied_even_when_allow_listed():
    toml = b'''
[llm]
models = [{ provider = "openai", model = "m", api_key_env = "RATCHET_LLM_KEY" }]
[backend.shell]
token_env = "PLAIN"
'''
    deny = declared_env_names(toml)
    assert deny == {"RATCHET_LLM_KEY", "PLAIN"}
    env = {"RATCHET_LLM_KEY": "k", "PLAIN": "k", "RATCHET_OK": "v", "PATH": "/bin"}
    assert scrub_env(env, ["PLAIN"], deny) == {"RATCHET_OK": "v", "PATH": "/bin"}
    assert declared_env_names(b"not toml [") == set()


def test_worker_env_keeps_no_keys_and_no_ratchet_names():
    env = {"PATH": "/bin", "PYTHONPATH": "/src", "OPENAI_API_KEY": "k", "RATCHET_X": "1",
           "RANDOM": "r"}
    assert worker_env(env) == {"PATH": "/bin", "PYTHONPATH": "/src"}


def test_data_digest_covers_modes_and_restores(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "a.txt").write_text("x")
    make_readonly(data)
    digest = data_digest(data)
    assert ensure_intact(data, digest) is None
    assert (tmp_path / "pristine").is_dir()
    os.chmod(data / "a.txt", 0o644)
    assert data_digest(data) != digest
    assert "restored" in ensure_intact(data, digest)
    assert data_digest(data) == digest


def test_old_results_still_load():
    old = {"job_id": "j", "outcome": "ok", "phases": []}
    result = JobResult.from_json(json.dumps(old))
    assert result.metrics_source == "" and result.notes == [] and result.fingerprint == {}
    newer = {**old, "a_field_from_a_newer_worker": 1, "fingerprint": {"cores": "2"}}
    assert JobResult.from_json(json.dumps(newer)).fingerprint == {"cores": "2"}
    result.memory_gb = 0.25
    assert JobResult.from_json(result.to_json()) == result


def test_sandbox_is_described_plainly():
    line = sandbox.describe()
    kind = sandbox.choose("auto")
    assert {"bwrap": "bwrap", "pidns": "pid namespace", "none": "NO ISOLATION"}[kind] in line


def test_each_isolation_level_hides_other_processes(tmp_path):
    """Run a /proc scan under every level this machine offers: only its own processes."""
    import pytest

    levels = [kind for kind, works in (("bwrap", sandbox.bwrap_works()),
                                       ("pidns", sandbox.unshare_prefix() is not None)) if works]
    if not levels:
        pytest.skip("neither bubblewrap nor unshare works here")
    for kind in levels:
        argv = sandbox.command(kind, ["/bin/sh", "-c", "ls /proc | grep -c '^[0-9]'"],
                               sandbox.Policy(writable=[tmp_path]))
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, (kind, out.stderr)
        # sh, ls, grep and the warden (plus bubblewrap's init): nothing of the machine's
        assert int(out.stdout.strip()) <= 5, (kind, out.stdout)


def test_gpu_memory_is_read_for_the_phase_processes(tmp_path):
    """A stand-in nvidia-smi (the real one needs a GPU) reports 2 GiB for the phase's pid
    and 5 GiB for an unrelated one: only the phase's count. Measured from a process of its
    own, as the worker measures its phases: this test's process has other descendants."""
    fake = tmp_path / "nvidia-smi"
    probe = textwrap.dedent("""
        import json, subprocess, sys, time
        from ratchet.job.procs import PeakMemory
        fake = sys.argv[1]
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3)"])
        with open(fake, "w") as smi:
            smi.write("#!/bin/sh\\necho '%d, 2048'\\necho '1, 5120'\\n" % child.pid)
        monitor = PeakMemory(interval_s=0.2, gpu_interval_s=0.0)
        monitor.smi = fake
        try:
            with monitor:
                time.sleep(1.0)
        finally:
            child.kill()
            child.wait()
        print(json.dumps([monitor.gpu_seen, monitor.tree_gpu, monitor.tree_rss]))
    """)
    fake.write_text("")
    fake.chmod(0o755)
    out = subprocess.run([sys.executable, "-c", probe, str(fake)], capture_output=True, text=True,
                         timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.returncode == 0, out.stderr
    gpu_seen, tree_gpu, tree_rss = json.loads(out.stdout)
    assert gpu_seen and tree_gpu == 2 << 30
    assert 0 < tree_rss < 1 << 30
