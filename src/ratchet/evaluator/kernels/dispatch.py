"""Per-shape choice with fallback: build `dispatch.json`, and pick from it at run time.

Custom kernels win only in some shape ranges (a softmax kernel tuned for 4k columns may
lose to the library at 64 or at 32k). Rather than forcing one winner everywhere, we
keep a table keyed by shape bucket with the fastest *correct* implementation in each,
and use the library baseline wherever the custom one loses, fails, or was not measured.

Bucketing rule (explicit, recorded in the table): each dimension named in `dims` is
rounded up to the next power of two (1000 -> 1024, 1024 -> 1024); dimensions not named
must match exactly. The table is tagged with the device name and library versions;
a `Dispatcher` on a different device, or with different versions, falls back to the
baseline everywhere until the table is rebuilt.
"""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from . import arrays
from .hardware import library_versions

FORMAT = 1


def next_pow2(n: int) -> int:
    """Smallest power of two >= n (n >= 1)."""
    n = int(n)
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def bucket_of(shape: Mapping[str, Any], dims: Sequence[str] | None = None) -> str:
    """'cols=1024,rows=64': `dims` (default all integer dims) rounded up to powers of two."""
    chosen = set(shape) if dims is None else set(dims)
    parts = []
    for name in sorted(shape):
        value = shape[name]
        if name in chosen and isinstance(value, int) and not isinstance(value, bool):
            value = next_pow2(value)
        parts.append(f"{name}={value}")
    return ",".join(parts)


def _records(results: Any) -> list[dict[str, Any]]:
    """Accept records [{impl, shape, ok, time_s}], {impl: [records]} or a SweepReport-like mapping."""
    if isinstance(results, Mapping):
        out = []
        for impl, rows in results.items():
            for row in rows:
                out.append({**row, "impl": row.get("impl", impl)})
        return out
    return [dict(r) for r in results]


def build_dispatch_table(
    results: Iterable[Mapping[str, Any]] | Mapping[str, Iterable[Mapping[str, Any]]],
    *,
    baseline: str,
    dims: Sequence[str] | None = None,
    margin: float = 0.0,
    device: str | None = None,
    versions: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The table: per bucket the fastest correct implementation, else the baseline.

    results: one record per (impl, shape) with keys impl, shape (dict), ok (bool),
    time_s (float, or None when not timed), optionally dtype. Within a bucket an
    implementation competes only if it was correct and timed on *every* shape any
    implementation was run on in that bucket; its score is the geometric mean of its times there. A
    non-baseline implementation must beat the baseline by more than `margin` (relative,
    e.g. 0.02 = 2%) to be chosen, so noise does not flip a bucket away from the library.
    """
    by_bucket: dict[str, dict[str, dict[str, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in _records(results):
        key = bucket_of(r["shape"], dims)
        if r.get("dtype"):
            key += f" {r['dtype']}"
        by_bucket[key][r["impl"]][json.dumps(r["shape"], sort_keys=True)] = r
    buckets: dict[str, Any] = {}
    for key in sorted(by_bucket):
        impls = by_bucket[key]
        # Every shape any implementation was run on: a competitor must be correct on all.
        shapes = set().union(*(set(v) for v in impls.values()))
        scores: dict[str, dict[str, Any]] = {}
        for impl, rows in impls.items():
            missing = shapes - set(rows)
            failed = [s for s, r in rows.items() if s in shapes and (not r.get("ok") or not r.get("time_s"))]
            if missing or failed:
                why = "failed on " + ", ".join(json.loads(s).__repr__() for s in failed) if failed else "not measured on every shape"
                scores[impl] = {"ok": False, "why": why}
                continue
            times = [float(rows[s]["time_s"]) for s in shapes]
            scores[impl] = {"ok": True, "time_s": math.exp(sum(math.log(t) for t in times) / len(times))}
        base_time = scores.get(baseline, {}).get("time_s")
        eligible = {i: s for i, s in scores.items() if s["ok"]}
        choice, reason = baseline, "baseline (no correct alternative)"
        if eligible:
            best = min(eligible, key=lambda i: eligible[i]["time_s"])
            if best == baseline:
                reason = "baseline is fastest"
            elif base_time is None:
                choice, reason = best, "fastest correct (baseline not correct/measured here)"
            elif eligible[best]["time_s"] < base_time * (1.0 - margin):
                choice, reason = best, f"fastest correct: {base_time / eligible[best]['time_s']:.3f}x the baseline"
            else:
                reason = f"{best} within margin of the baseline ({base_time / eligible[best]['time_s']:.3f}x <= {1 / (1 - margin):.3f}x)"
        chosen_time = scores.get(choice, {}).get("time_s")
        buckets[key] = {
            "impl": choice,
            "reason": reason,
            "time_s": chosen_time,
            "baseline_time_s": base_time,
            "speedup": base_time / chosen_time if base_time and chosen_time else None,
            "candidates": scores,
        }
    return arrays.jsonable(
        {
            "format": FORMAT,
            "device": device,
            "versions": dict(versions) if versions is not None else library_versions(),
            "baseline": baseline,
            "dims": list(dims) if dims is not None else None,
            "bucket_rule": "each dim in `dims` (all integer dims when null) rounded up to the next power of two; others exact",
            "buckets": buckets,
        }
    )


def write_dispatch(table: Mapping[str, Any], path: str | os.PathLike[str] = "dispatch.json") -> Path:
    out = Path(path)
    out.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    return out


def load_dispatch(path: str | os.PathLike[str] = "dispatch.json") -> dict[str, Any]:
    table = json.loads(Path(path).read_text())
    if table.get("format") != FORMAT:
        raise ValueError(f"{path}: dispatch table format {table.get('format')!r}, expected {FORMAT}")
    return table


def dispatch_markdown(table: Mapping[str, Any]) -> str:
    """The table as Markdown for reports."""
    lines = [
        f"dispatch table for {table.get('device') or 'unspecified device'}; baseline `{table['baseline']}`; "
        f"versions {', '.join(f'{k} {v}' for k, v in (table.get('versions') or {}).items())}",
        "",
        "| bucket | impl | speedup | reason |",
        "|---|---|---|---|",
    ]
    for key, b in table["buckets"].items():
        sp = f"{b['speedup']:.3f}" if b.get("speedup") else "-"
        lines.append(f"| {key} | {b['impl']} | {sp} | {b['reason']} |")
    return "\n".join(lines)


class Dispatcher:
    """Pick an implementation per call by the shape's bucket, falling back to the baseline.

    impls maps names used in the table to callables. A bucket missing from the table, or
    naming an implementation not in `impls`, uses the baseline. If `device` / `versions`
    are given and differ from the table's tags, the table is stale: baseline everywhere,
    and `stale_reason` says why.
    """

    def __init__(
        self,
        table: Mapping[str, Any] | str | os.PathLike[str],
        impls: Mapping[str, Callable[..., Any]],
        *,
        device: str | None = None,
        versions: Mapping[str, str] | None = None,
    ) -> None:
        self.table = dict(load_dispatch(table) if isinstance(table, str | os.PathLike) else table)
        self.impls = dict(impls)
        self.baseline = self.table["baseline"]
        if self.baseline not in self.impls:
            raise ValueError(f"the baseline {self.baseline!r} must be among impls {sorted(self.impls)}")
        self.dims = self.table.get("dims")
        self.stale_reason = ""
        if device is not None and self.table.get("device") not in (None, device):
            self.stale_reason = f"table built on {self.table.get('device')!r}, running on {device!r}"
        elif versions is not None:
            tagged = self.table.get("versions") or {}
            changed = [f"{k} {tagged.get(k)} -> {v}" for k, v in versions.items() if k in tagged and tagged[k] != v]
            if changed:
                self.stale_reason = "library versions changed: " + ", ".join(changed)

    def choose(self, shape: Mapping[str, Any], dtype: str | None = None) -> str:
        """Name of the implementation to use for `shape` (and dtype, if the table has them)."""
        if self.stale_reason:
            return self.baseline
        key = bucket_of(shape, self.dims)
        entry = self.table["buckets"].get(f"{key} {dtype}" if dtype else key) or self.table["buckets"].get(key)
        if not entry or entry["impl"] not in self.impls:
            return self.baseline
        return entry["impl"]

    def __call__(self, shape: Mapping[str, Any], *args: Any, dtype: str | None = None, **kwargs: Any) -> Any:
        return self.impls[self.choose(shape, dtype)](*args, **kwargs)


def dispatch(
    table: Mapping[str, Any] | str | os.PathLike[str],
    impls: Mapping[str, Callable[..., Any]],
    shape: Mapping[str, Any],
    *args: Any,
    dtype: str | None = None,
    **kwargs: Any,
) -> Any:
    """One-shot form of Dispatcher: choose by shape and call with *args/**kwargs."""
    return Dispatcher(table, impls)(shape, *args, dtype=dtype, **kwargs)


def results_from_sweeps(reports: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Records for build_dispatch_table from {impl name: SweepReport} (timing the impl's column).

    The baseline's own records come from the first report's baseline times.
    """
    records: list[dict[str, Any]] = []
    base_done = False
    for impl, report in reports.items():
        for r in report.results:
            records.append({"impl": impl, "shape": r.shape, "dtype": r.dtype, "ok": r.correct, "time_s": r.time_s})
            if not base_done and r.baseline_time_s:
                records.append({"impl": report.baseline, "shape": r.shape, "dtype": r.dtype, "ok": True, "time_s": r.baseline_time_s})
        base_done = True
    return records
