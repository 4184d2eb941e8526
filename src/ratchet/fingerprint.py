"""The machine a result was measured on: stable facts, no hostname.

A metric is only comparable with another measured on the same hardware and software:
a kernel 10% faster on an H100 says nothing about an A100, and a torch upgrade can move
a baseline by more than the noise. The worker records this fingerprint with every
result, so the report can group results by `fingerprint_key` and flag any that came
from different hardware instead of comparing them silently.

Stdlib only and cheap (the worker must start fast): library versions come from package
metadata, so nothing here imports torch; nvidia-smi runs at most once per process.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
from collections import Counter
from importlib import metadata
from pathlib import Path

LIBRARIES = ("numpy", "torch", "triton")
# The facts that decide whether two timings are comparable at all.
HARDWARE_KEYS = ("arch", "cpu", "cores", "gpu")
SOFTWARE_ORDER = ("gpu_driver", "python", *LIBRARIES)
NVIDIA_SMI_TIMEOUT_S = 10.0


def machine_fingerprint() -> dict[str, str]:
    """{fact: value} of this machine; absent facts (no GPU, no torch) are left out.

    Read once per process; each call returns a fresh copy the caller may change.
    """
    return dict(_fingerprint())


@functools.cache
def _fingerprint() -> dict[str, str]:
    fp = {
        "arch": platform.machine() or "unknown",
        "cpu": _cpu_model(),
        "cores": str(os.cpu_count() or 0),
        "python": platform.python_version(),
    }
    gpus, drivers = _nvidia_gpus()
    if gpus:
        fp["gpu"] = _summarise(gpus)
        fp["gpu_driver"] = ", ".join(sorted(set(drivers)))
    for name in LIBRARIES:
        try:
            fp[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return fp


def fingerprint_key(fp: dict[str, str] | None) -> str:
    """A readable key equal for results whose timings are comparable (same hardware).

    Software versions are not in the key: they are shown, and a change is noted, but a
    driver or library upgrade on the same machine does not split the study in two.
    """
    if not fp:
        return "unknown machine"
    parts = [fp.get("arch", "?"), fp.get("cpu", "?"), f"{fp.get('cores', '?')} cores",
             fp.get("gpu") or "no GPU"]
    return " | ".join(parts)


def software_key(fp: dict[str, str] | None) -> str:
    """Driver, Python and library versions: the part of a fingerprint outside the key."""
    if not fp:
        return ""
    # a fixed order: a fingerprint read back from JSON (keys sorted) reads the same
    known = [k for k in SOFTWARE_ORDER if k in fp]
    rest = sorted(k for k in fp if k not in HARDWARE_KEYS and k not in SOFTWARE_ORDER)
    return ", ".join(f"{k} {fp[k]}" for k in known + rest)


def _cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    match = re.search(r"^(?:model name|Model|Hardware)\s*:\s*(.+)$", text, re.MULTILINE)
    if match:
        return " ".join(match.group(1).split())
    return platform.processor() or platform.machine() or "unknown"


def _nvidia_gpus() -> tuple[list[str], list[str]]:
    """(device names, driver versions) from nvidia-smi; ([], []) without it or on error."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return [], []
    try:
        proc = subprocess.run(
            [exe, "--query-gpu=name,driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return [], []
    if proc.returncode != 0:
        return [], []
    names, drivers = [], []
    for line in proc.stdout.splitlines():
        name, _, driver = line.rpartition(",")
        if name.strip() and driver.strip():
            names.append(" ".join(name.split()))
            drivers.append(driver.strip())
    return names, drivers


def _summarise(names: list[str]) -> str:
    """['H100', 'H100', 'A100'] -> '2x H100, 1x A100' (order of first appearance)."""
    return ", ".join(f"{n}x {name}" for name, n in Counter(names).items())
