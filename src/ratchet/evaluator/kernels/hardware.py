"""What machine this is, as facts a proposer can use: `hardware_context()` and `hardware.md`.

A kernel proposer that does not know the cache sizes, SIMD width, SM count or measured
bandwidth guesses; these facts are cheap to read once (/proc, /sys, lscpu, torch or
nvidia-smi) and go into `hardware.md`, which the proposer's context includes.
Nothing here imports torch unless asked to (`use_torch`), and nothing fails on a
machine that lacks a file: a missing fact is simply absent.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import re
import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMG]?)i?B?\s*$", re.IGNORECASE)
_SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_bf16", "avx512_fp16", "amx_tile", "neon", "asimd", "sve")


def _parse_size(text: str) -> int | None:
    """'32768K' / '1 MiB' / '512 KB' -> bytes."""
    m = _SIZE.match(text.strip())
    if not m:
        return None
    scale = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def cpu_caches() -> list[dict[str, Any]]:
    """Cache levels of CPU 0 from /sys: level, type, size in bytes, shared by how many CPUs."""
    caches = []
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(base.glob("index*")):
        size = _parse_size(_read(index / "size") or "")
        if size is None:
            continue
        shared = _read(index / "shared_cpu_list") or ""
        caches.append(
            {
                "level": int(_read(index / "level") or 0),
                "type": _read(index / "type") or "Unknown",
                "size_bytes": size,
                "shared_cpu_list": shared,
            }
        )
    if not caches and shutil.which("lscpu"):
        try:
            out = subprocess.run(["lscpu", "-C", "--bytes"], capture_output=True, text=True, timeout=5).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines()[1:]:
            cols = line.split()
            if len(cols) >= 4 and cols[2].isdigit():
                level = int(re.sub(r"\D", "", cols[0]) or 0)
                caches.append({"level": level, "type": cols[3] if len(cols) > 3 else "", "size_bytes": int(cols[2])})
    return caches


def llc_bytes(default: int = 32 << 20) -> int:
    """Size of the last-level CPU cache (the largest level); `default` when unknown."""
    caches = cpu_caches()
    if not caches:
        return default
    top = max(c["level"] for c in caches)
    return max(c["size_bytes"] for c in caches if c["level"] == top)


def cpu_info() -> dict[str, Any]:
    """Model, core counts, SIMD features, memory size."""
    info: dict[str, Any] = {"arch": platform.machine(), "logical_cpus": os.cpu_count()}
    with contextlib.suppress(AttributeError, OSError):
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    text = _read(Path("/proc/cpuinfo")) or ""
    model = re.search(r"^(?:model name|Model|Hardware)\s*:\s*(.+)$", text, re.MULTILINE)
    info["model"] = model.group(1).strip() if model else platform.processor() or platform.machine()
    flags_line = re.search(r"^(?:flags|Features)\s*:\s*(.+)$", text, re.MULTILINE)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    info["simd"] = [f for f in _SIMD_FLAGS if f in flags]
    mem = re.search(r"^MemTotal:\s*(\d+)\s*kB", _read(Path("/proc/meminfo")) or "", re.MULTILINE)
    if mem:
        info["memory_bytes"] = int(mem.group(1)) * 1024
    info["caches"] = cpu_caches()
    return info


def gpu_info(use_torch: bool = False) -> list[dict[str, Any]]:
    """One dict per CUDA device; [] if none.

    nvidia-smi by default; through torch (importing it if need be) when `use_torch` asks,
    which adds SM count and L2 size. A study's driver never asks: importing torch costs it
    seconds before its first proposal, and asking torch about a device opens a CUDA
    context that would hold GPU memory beside the candidates for the whole study.
    """
    gpus: list[dict[str, Any]] = []
    torch: Any = None
    if use_torch and _installed("torch"):
        try:  # optional, only to describe the GPU
            torch = importlib.import_module("torch")
        except Exception:  # a broken torch install must not break hardware.md
            torch = None
    if torch is not None:
        try:
            if torch.cuda.is_available():
                for i in range(torch.cuda.device_count()):
                    p = torch.cuda.get_device_properties(i)
                    gpu = {
                        "index": i,
                        "name": p.name,
                        "memory_bytes": int(p.total_memory),
                        "compute_capability": f"{p.major}.{p.minor}",
                        "sm_count": int(p.multi_processor_count),
                    }
                    l2 = getattr(p, "L2_cache_size", None)
                    if l2:
                        gpu["l2_cache_bytes"] = int(l2)
                    gpu["features"] = _gpu_features(p.major, p.minor)
                    gpus.append(gpu)
                return gpus
        except Exception:
            gpus = []
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index,name,memory.total,compute_cap", "--format=csv,noheader,nounits"],
                capture_output=True,
                text=True,
                timeout=10,
            ).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.strip().splitlines():
            cols = [c.strip() for c in line.split(",")]
            if len(cols) >= 4:
                gpu = {"index": int(cols[0]), "name": cols[1], "memory_bytes": int(float(cols[2])) << 20, "compute_capability": cols[3]}
                try:
                    major, minor = (int(v) for v in cols[3].split("."))
                    gpu["features"] = _gpu_features(major, minor)
                except ValueError:
                    pass
                gpus.append(gpu)
    return gpus


def _gpu_features(major: int, minor: int) -> dict[str, bool]:
    """Features a kernel writer cares about, decided by compute capability."""
    cc = major * 10 + minor
    return {
        "tensor_cores": cc >= 70,
        "bf16": cc >= 80,
        "async_copy (cp.async)": cc >= 80,
        "fp8": cc >= 89,
        "tma": cc >= 90,
        "wgmma": cc == 90,
        "thread_block_clusters": cc >= 90,
    }


def _installed(dist: str) -> bool:
    try:
        metadata.version(dist)
    except metadata.PackageNotFoundError:
        return False
    return True


def library_versions(names: tuple[str, ...] = ("numpy", "torch", "triton")) -> dict[str, str]:
    """Installed versions read from package metadata (importing nothing)."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def hardware_context(use_torch: bool = False) -> dict[str, Any]:
    """Everything above in one JSON-serialisable dict (`use_torch`: see gpu_info)."""
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu": cpu_info(),
        "gpus": gpu_info(use_torch),
        "libraries": library_versions(),
        "blas": _blas_name(),
    }


def _blas_name() -> str | None:
    try:
        import numpy as np  # noqa: PLC0415

        config = np.show_config(mode="dicts")
        blas = config.get("Build Dependencies", {}).get("blas", {})
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:  # show_config's format differs across numpy versions
        return None


def _human(n: float | int | None, unit: str = "B") -> str:
    if n is None:
        return "?"
    value = float(n)
    for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(value) < 1024 or prefix == "Ti":
            return f"{value:.0f} {prefix}{unit}" if prefix == "" else f"{value:.1f} {prefix}{unit}"
        value /= 1024
    return f"{value:.1f} {unit}"


def hardware_markdown(context: dict[str, Any] | None = None, peaks: list[dict[str, Any]] | None = None) -> str:
    """The text of hardware.md for `context` (default: this machine) and measured peaks."""
    ctx = context or hardware_context()
    cpu = ctx["cpu"]
    lines = ["# Hardware", "", "Generated by ratchet.evaluator.kernels.write_hardware_md; facts read from this machine.", ""]
    lines += ["## CPU", ""]
    lines.append(f"- model: {cpu.get('model')} ({cpu.get('arch')})")
    lines.append(f"- cpus: {cpu.get('usable_cpus', cpu.get('logical_cpus'))} usable of {cpu.get('logical_cpus')} logical")
    lines.append(f"- SIMD: {', '.join(cpu.get('simd') or []) or 'unknown'}")
    if "memory_bytes" in cpu:
        lines.append(f"- memory: {_human(cpu['memory_bytes'])}")
    for c in cpu.get("caches", []):
        shared = f", shared by CPUs {c['shared_cpu_list']}" if c.get("shared_cpu_list") else ""
        lines.append(f"- L{c['level']} {c['type'].lower()} cache: {_human(c['size_bytes'])}{shared}")
    if ctx.get("blas"):
        lines.append(f"- BLAS: {ctx['blas']}")
    lines += ["", "## GPUs", ""]
    if not ctx.get("gpus"):
        lines.append("- none visible (no CUDA device through torch or nvidia-smi)")
    for g in ctx.get("gpus", []):
        extra = f", {g['sm_count']} SMs" if "sm_count" in g else ""
        l2 = f", L2 {_human(g['l2_cache_bytes'])}" if "l2_cache_bytes" in g else ""
        lines.append(f"- cuda:{g['index']}: {g['name']}, compute capability {g.get('compute_capability', '?')}{extra}, memory {_human(g.get('memory_bytes'))}{l2}")
        feats = g.get("features") or {}
        if feats:
            have = [k for k, v in feats.items() if v]
            lack = [k for k, v in feats.items() if not v]
            lines.append(f"  - has: {', '.join(have) or 'none of the listed'}; lacks: {', '.join(lack) or 'none'}")
    lines += ["", "## Libraries", ""]
    for name, version in ctx.get("libraries", {}).items():
        lines.append(f"- {name} {version}")
    lines += ["", "## Measured peaks", ""]
    if not peaks:
        lines.append("- not measured yet (run `python -c 'import ratchet.evaluator.kernels as k; k.measure_peaks()'`)")
    for p in peaks or []:
        lines.append(f"- {p['device']}: memory bandwidth {p['bandwidth_Bps'] / 1e9:.1f} GB/s (copy), call/launch overhead {p['overhead_s'] * 1e6:.2f} us")
        for dtype, flops in sorted(p.get("flops", {}).items()):
            lines.append(f"  - {dtype} matmul: {flops / 1e9:.1f} GFLOP/s")
        ridge = {d: f / p["bandwidth_Bps"] for d, f in p.get("flops", {}).items()}
        if ridge:
            lines.append("  - ridge point (FLOP/byte): " + ", ".join(f"{d} {r:.1f}" for d, r in sorted(ridge.items())))
    lines.append("")
    return "\n".join(lines)


MODEL_MD_TEMPLATE = """\
# Model context

What the model really computes, so a proposer optimises the cases that matter.
Fill every field in; delete none (write "n/a" instead).

## The operation
- name: <e.g. row softmax over attention scores>
- called from: <e.g. attention layer, once per layer per step>
- inputs: <name: shape [dims], dtype, layout/contiguity>
- outputs: <name: shape, dtype; in place allowed? yes/no>
- numerics: <required accuracy; accumulate in fp32? stable (max-subtracted)?>

## Shapes that matter (production)
| context | shape | dtype | share of runtime |
|---|---|---|---|
| prefill, short | <rows x cols> | <bf16> | <%> |
| prefill, long (32k) | <...> | <...> | <%> |
| decode | <...> | <...> | <%> |

## How it is run
- under CUDA graphs: <yes/no>; torch.compile: <yes/no>
- batch sizes: <...>; sequence lengths: <min..max>
- neighbouring ops that could be fused: <...>

## What must not change
- <e.g. output dtype, determinism requirement, memory limit>
"""


def write_model_md(path: str | os.PathLike[str] = "model.md") -> Path:
    """Write the model.md template (never overwrites an existing file: it holds user facts)."""
    out = Path(path)
    if not out.exists():
        out.write_text(MODEL_MD_TEMPLATE)
    return out


if __name__ == "__main__":  # `python -m ratchet.evaluator.kernels.hardware` prints the context
    print(json.dumps(hardware_context(use_torch=True), indent=2))
