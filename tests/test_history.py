"""`ratchet log`, `ratchet diff`, progress.png and the machine fingerprint, on a real study."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import zlib

import pytest
from handoff_study import KEPT, handoff_study
from helpers import ROOT, git, ratchet

from ratchet.core.candidate import Candidate
from ratchet.job.fingerprint import fingerprint_key, machine_fingerprint, software_key
from ratchet.ui.history import reason_kind, success_shares


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    return handoff_study(tmp_path_factory)


def log(study, *args: str) -> list[str]:
    proc = ratchet(study.repo, "log", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.splitlines()


# ---------------------------------------------------------------------------------------
# ratchet log


def test_log_has_one_line_per_candidate_like_git_log_oneline(study):
    cands = study.ledger()
    lines = log(study)
    assert len(lines) == len(cands) == 8  # baseline + 7 proposals
    for line, cand in zip(lines, cands, strict=True):
        fields = line.split()
        # a proposal refused before it became a commit shows a placeholder for it
        assert fields[:3] == [cand.id, cand.short or "-------", cand.status]
        assert fields[3] == "score=" + ("-" if cand.metric is None else f"{cand.metric:.6g}")
        assert fields[4] == "gain=" + ("-" if cand.gain is None else f"{cand.gain:+.4g}")
        assert fields[5] == "cost=$0.0000"  # nothing priced in this study
    line_of = dict(zip((c.id for c in cands), lines, strict=True))
    ideas = {idea: line_of[c.id] for idea, c in study.by_idea().items()}
    # a kept step ends with what it cost to get there
    step = ideas["set X to 1.4"].split("X = 1.4: closer to the optimum ")[1]
    assert step.startswith("[to get here: $0.0000 = proposer $0.0000 + compute $0.0000, ")
    assert step.endswith(f" since {study.by_idea()['set X to 1.5'].id}]")
    assert "score=0.0225" in ideas["set X to 1.4"] and "gain=+0.04" in ideas["set X to 1.4"]
    assert "[touches protected path evaluate.py]" in ideas["edit the evaluator"]  # why
    assert "[evaluate failed: exit code 1" in ideas["make it crash"]
    assert "(baseline) baseline" in line_of["c0000"]


def test_log_filters(study):
    cands = study.ledger()
    ideas = study.by_idea()

    def ids(*args: str) -> list[str]:
        return [line.split()[0] for line in log(study, *args)]

    assert ids("--kept") == [c.id for c in cands if c.status == "keep"]
    assert ids("--kept") == ["c0000", *sorted(ideas[i].id for i in KEPT)]
    own = next(c for c in cands if c.kind == "candidate" and c.idea is None)  # no idea left
    assert own.status == "discard"
    assert ids("--status", "discard") == sorted([ideas["set X to 5.0"].id, own.id])
    assert ids("--status", "crash") == [ideas["make it crash"].id]
    rounds = sorted({c.round for c in cands})
    assert len(rounds) >= 3
    for r in rounds:
        assert ids("--round", str(r)) == [c.id for c in cands if c.round == r]
    x15 = ideas["set X to 1.5"]
    assert ids("--round", str(x15.round), "--kept") == [x15.id]
    assert ids("--round", str(ideas["set X to 5.0"].round), "--kept") == []
    assert log(study, "--round", "9") == []
    proc = ratchet(study.repo, "log", "--status", "kept")
    assert proc.returncode == 2 and "unknown status 'kept'" in proc.stderr


# ---------------------------------------------------------------------------------------
# ratchet diff


def diff(study, a: str, b: str) -> subprocess.CompletedProcess:
    proc = ratchet(study.repo, "diff", a, b)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_diff_between_candidates_incumbent_and_baseline(study):
    ideas = study.by_idea()
    x2, x15, x14 = (ideas[i] for i in KEPT)
    start, incumbent = study.meta("pinned"), study.meta("incumbent")

    proc = diff(study, "baseline", "incumbent")
    assert proc.stdout.strip() == git(study.repo, "diff", start, incumbent)
    assert "-X = 3.0  # the knob" in proc.stdout and "+X = 1.4  # the knob" in proc.stdout
    assert (f"baseline (the study start) {start[:7]} -> incumbent ({x14.id}) {incumbent[:7]}"
            in proc.stderr)

    proc = diff(study, x2.id, x15.id)  # two candidates (by id, then by commit prefix)
    assert proc.stdout.strip() == git(study.repo, "diff", x2.commit_sha, x15.commit_sha)
    assert "-X = 2.0" in proc.stdout and "+X = 1.5" in proc.stdout
    assert diff(study, x2.commit_sha[:8], x15.id).stdout == proc.stdout

    # the rejected one, which rewrote the evaluator: refused before it became a commit,
    # so there is nothing to diff, and the one line says why
    refused = ideas["edit the evaluator"].id
    proc = ratchet(study.repo, "diff", refused, "incumbent")
    assert proc.returncode != 0 and "has no commit" in proc.stderr
    assert "touches protected path evaluate.py" in proc.stderr

    proc = diff(study, x14.id, "incumbent")
    assert proc.stdout == "" and "no difference" in proc.stderr


def test_diff_unknown_names_fail_clearly(study):
    proc = ratchet(study.repo, "diff", "c0099", "incumbent")
    assert proc.returncode == 2 and "no candidate 'c0099'" in proc.stderr
    assert ratchet(study.repo, "diff", "incumbent").returncode != 0  # B is required


# ---------------------------------------------------------------------------------------
# progress.png


def png_pixels(data: bytes) -> tuple[int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA non-interlaced PNG (what matplotlib writes): (w, h, rows)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,), kind = struct.unpack(">I", data[pos:pos + 4]), data[pos + 4:pos + 8]
        body = data[pos + 8:pos + 8 + length]
        assert zlib.crc32(kind + body) == struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])[0]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0
    channels = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, prev = [], bytearray(stride)
    for y in range(height):
        filt, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for x in range(stride):
            a = line[x - channels] if x >= channels else 0
            b, c = prev[x], prev[x - channels] if x >= channels else 0
            if filt == 1:
                line[x] = (line[x] + a) & 0xFF
            elif filt == 2:
                line[x] = (line[x] + b) & 0xFF
            elif filt == 3:
                line[x] = (line[x] + (a + b) // 2) & 0xFF
            elif filt == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[x] = (line[x] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, rows


def test_progress_png_written_by_run_and_report(study):
    path = study.repo / "progress.png"
    assert path.is_file()  # `ratchet run` wrote it at the end
    assert "progress.png" not in git(study.repo, "status", "--porcelain", "--ignored=no")
    width, height, rows = png_pixels(path.read_bytes())
    assert 1000 <= width <= 2000 and 500 <= height <= 1200
    # the kept points and the running-best line are drawn in the keep green (#2e7d32):
    # many pixels of it, not a blank canvas
    green = sum(row.count(bytes((0x2E, 0x7D, 0x32))) for row in rows)
    assert green > 500

    old = path.stat().st_mtime_ns
    time.sleep(0.05)
    proc = ratchet(study.repo, "report")
    assert proc.returncode == 0, proc.stderr
    assert "progress.png" in proc.stderr and path.stat().st_mtime_ns > old
    assert png_pixels(path.read_bytes())[:2] == (width, height)


# ---------------------------------------------------------------------------------------
# fingerprint (fast, pure)


def fingerprint_in_subprocess(path: str) -> dict:
    code = "import json; from ratchet.job.fingerprint import machine_fingerprint as f; print(json.dumps(f()))"
    env = {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    import json

    return json.loads(out.stdout)


def test_fingerprint_is_stable_hostname_free_and_imports_nothing_heavy():
    fp = machine_fingerprint()
    for key in ("arch", "cpu", "cores", "python"):
        assert fp[key]
    assert fp["cores"] == str(os.cpu_count())
    assert os.uname().nodename not in " ".join(fp.values())
    assert machine_fingerprint() == fp
    fp["cpu"] = "changed by a caller"
    assert machine_fingerprint()["cpu"] != "changed by a caller"  # a copy each time
    code = ("import sys; from ratchet.job.fingerprint import machine_fingerprint as f; f(); "
            "print('torch' in sys.modules, 'numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert out.stdout.split() == ["False", "False"]


def test_fingerprint_reads_gpus_and_driver_from_nvidia_smi(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text("#!/bin/sh\n"
                   '[ "$1" = "--query-gpu=name,driver_version" ] || exit 9\n'
                   "printf 'NVIDIA H100 80GB HBM3, 550.54.15\\nNVIDIA H100 80GB HBM3, 550.54.15\\n'\n")
    smi.chmod(0o755)
    path = f"{bin_dir}:{os.environ['PATH']}"
    fp = fingerprint_in_subprocess(path)
    assert fp["gpu"] == "2x NVIDIA H100 80GB HBM3" and fp["gpu_driver"] == "550.54.15"
    assert "2x NVIDIA H100 80GB HBM3" in fingerprint_key(fp)

    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")  # a broken driver
    assert "gpu" not in fingerprint_in_subprocess(path)
    no_smi = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep)
                             if not os.path.exists(os.path.join(p, "nvidia-smi")))
    assert "gpu" not in fingerprint_in_subprocess(no_smi)


def test_fingerprint_key_groups_by_hardware_not_software():
    a = {"arch": "x86_64", "cpu": "EPYC", "cores": "64", "gpu": "8x H100", "gpu_driver": "550",
         "python": "3.11.7", "torch": "2.5.0"}
    upgraded = {**a, "gpu_driver": "560", "torch": "2.6.0"}
    other = {**a, "gpu": "8x A100"}
    assert fingerprint_key(a) == fingerprint_key(upgraded) != fingerprint_key(other)
    assert software_key(a) != software_key(upgraded) and "torch 2.6.0" in software_key(upgraded)
    assert software_key(dict(sorted(a.items()))) == software_key(a) == "gpu_driver 550, python 3.11.7, torch 2.5.0"
    assert fingerprint_key(None) == "unknown machine"


# ---------------------------------------------------------------------------------------
# success shares (fast, pure)


def test_success_shares_by_proposer_and_idea():
    def cand(i, status, proposer="llm", idea=None, reasons=None, kind="candidate"):
        return Candidate(id=f"c{i:04d}", seq=i, round=1, status=status, kind=kind,
                         proposer=proposer, idea=idea, reasons=reasons)

    cands = [
        cand(0, "keep", proposer=None, kind="baseline"),  # not a proposal: not counted
        cand(1, "keep", idea="fuse"),
        cand(2, "discard", idea="fuse"),
        cand(3, "rejected", reasons="overfit: hold-out score 99 vs incumbent 0.5"),
        cand(4, "rejected", reasons="overfit: hold-out score 98 vs incumbent 0.4"),
        cand(5, "crash", proposer="tune", reasons="evaluate failed: exit code 1: 'boom'"),
    ]
    llm, tune = success_shares(cands, "proposer")
    assert (llm.name, llm.counts, llm.judged) == ("llm", {"keep": 1, "discard": 1, "rejected": 2}, 4)
    assert llm.share("keep") == 0.25 and llm.share("rejected") == 0.5
    assert llm.reasons == {"rejected: overfit: hold-out score N vs incumbent N": 2}
    assert tune.counts == {"crash": 1} and tune.reasons == {"crash: evaluate failed: exit code N: '…'": 1}
    ideas = {s.name: s.counts for s in success_shares(cands, "idea")}
    assert ideas == {"fuse": {"keep": 1, "discard": 1},
                     "(no queued idea)": {"rejected": 2, "crash": 1}}
    assert reason_kind('touches protected path "a.py" 3 times') == "touches protected path '…' N times"
