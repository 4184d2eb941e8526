"""The trusted metric channel rejects what the evaluator did not write (issue 21, case 5).

A candidate child that reaches the evaluator's pipe (root, no PID namespace) can write a
fake line padded to overflow it, or a line of its own beside the real one, and can flood
the evaluator's stdout so that the printed echo falls into the capped log's dropped
middle. Each of those is tampering. Real evaluator processes write the channel here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

from ratchet.job import worker
from ratchet.job.jobspec import CHANNEL_LIMIT, collect_metrics
from ratchet.job.procs import CappedLog

REPORT = ("import sys\nfrom ratchet import channel\n"
          "channel.report({'correct': True, 'speedup': 1.25, 'reason': 'ok'})\n"
          "if len(sys.argv) > 2: channel.report({'extra': 3})\n")


def _evaluate(*extra: str) -> tuple[bytes, str]:
    """Run a real evaluator process with a channel; (what the pipe carried, its stdout)."""
    read, write = os.pipe()
    proc = subprocess.run([sys.executable, "-c", REPORT, str(write), *extra], pass_fds=[write],
                          env={**os.environ, "RATCHET_METRICS_FD": str(write)},
                          capture_output=True, text=True, timeout=60)
    os.close(write)
    data = b""
    while chunk := os.read(read, 1 << 16):
        data += chunk
    os.close(read)
    assert proc.returncode == 0, proc.stderr
    return data, proc.stdout


def _reading(channel: bytes, log: str):
    return collect_metrics(channel=channel, log_text=log, result_file=None, critical={"speedup", "correct"})


def test_an_honest_evaluator_reads_clean():
    data, out = _evaluate("twice")
    lines = [json.loads(x) for x in data.splitlines()]
    assert [x["ratchet:seq"] for x in lines] == [1, 2]
    r = _reading(data, out)
    assert r.tampering == [] and r.metrics == {"correct": True, "speedup": 1.25, "reason": "ok", "extra": 3}


def test_an_overflowing_channel_is_tampering():
    data, out = _evaluate()
    fake = json.dumps({"correct": True, "speedup": 5.0}).encode() + b" " * (CHANNEL_LIMIT)
    r = _reading((fake + data)[:CHANNEL_LIMIT], out)  # what the worker keeps of it
    assert any("overflowed" in t for t in r.tampering), r.tampering


def test_a_line_the_evaluator_did_not_write_is_tampering():
    data, out = _evaluate()
    forged = json.dumps({"correct": True, "speedup": 1.25, "ratchet:seq": 1, "ratchet:echo": True}).encode() + b"\n"
    for channel in (forged + data, data + b'{"correct": true, "speedup": 1.25}\n'):
        r = _reading(channel, out)
        assert any("did not write" in t for t in r.tampering), (channel, r.tampering)
    r = _reading(data + b'{"speedup": 1.2', out)
    assert any("cut-off" in t for t in r.tampering), r.tampering


def test_a_missing_or_flooded_echo_is_tampering(tmp_path):
    data, out = _evaluate()
    r = _reading(data, out.replace("speedup: 1.25\n", ""))
    assert any("echo of speedup is missing" in t for t in r.tampering), r.tampering
    # flooded after the echo: the capped log keeps its head and tail, the echo was in between
    log = CappedLog(tmp_path / "eval.log", 4096)
    log.feed(b"x" * 3000 + out.encode() + b"y\n" * 4000)
    r = _reading(data, log.text())
    assert any("missing" in t and "flooded" in t for t in r.tampering), r.tampering


def test_the_worker_keeps_exactly_the_limit_the_check_knows():
    assert worker.CHANNEL_LIMIT == CHANNEL_LIMIT
