"""The machine a result was measured on: stable facts, no hostname.

A metric is only comparable with another measured on the same hardware and software:
a kernel 10% faster on an H100 says nothing about an A100, and a torch upgrade can move
a baseline by more than the noise. The worker records this fingerprint with every
result, so the report can group results by `fingerprint_key` and flag any that came
from different hardware instead of comparing them silently.

Stdlib only and cheap (the worker must start fast): library versions come from package
metadata, so nothing here imports torch; nvidia-smi runs at most once per process.
`importlib.metadata` alone costs a worker ~25 ms to import (email, zipfile, csv...), so
the installed distributions' metadata directories are read directly, in `sys.path` order
as `importlib.metadata.version` does.
"""

from __future__ import annotations

import functools
import os
import platform
import re
import shutil
import subprocess
import sys
from collections import Counter
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
    for name, version in _versions(LIBRARIES).items():
        fp[name] = version
    return fp


def _normal(name: str) -> str:
    """A distribution name as metadata directory names spell it (PEP 503, `_`)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _versions(names: tuple[str, ...]) -> dict[str, str]:
    """{name: version} of the installed distributions among `names`; the first on
    sys.path wins. Absent ones are left out."""
    wanted = {_normal(n): n for n in names}
    found: dict[str, str] = {}
    for entry in sys.path:
        try:
            listing = os.scandir(entry or ".")
        except OSError:  # a zip archive or a missing directory: no libraries of ours
            continue
        with listing:
            for item in listing:
                stem, dot, kind = item.name.rpartition(".")
                if not dot or kind not in ("dist-info", "egg-info"):
                    continue
                key = _normal(stem.split("-", 1)[0])
                if key in wanted and wanted[key] not in found:
                    version = _metadata_version(Path(item.path), stem)
                    if version:
                        found[wanted[key]] = version
        if len(found) == len(wanted):
            break
    return found


def _metadata_version(path: Path, stem: str) -> str | None:
    """The `Version:` header of a dist-info / egg-info, else the one in its name."""
    meta = path / "METADATA" if path.suffix == ".dist-info" else path / "PKG-INFO"
    if path.is_file():  # an egg-info file (old setuptools) is PKG-INFO itself
        meta = path
    try:
        with meta.open(encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break  # the headers end at the first blank line
                if line.lower().startswith("version:"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    parts = stem.split("-")
    return parts[1] if len(parts) > 1 and parts[1] else None


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
    pattern = re.compile(r"^(?:model name|Model|Hardware)\s*:\s*(.+)$")
    try:  # line by line: the kernel writes one block per core, and the first one names it
        with open("/proc/cpuinfo", errors="replace") as fh:
            for line in fh:
                match = pattern.match(line)
                if match:
                    return " ".join(match.group(1).split())
    except OSError:
        pass
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
