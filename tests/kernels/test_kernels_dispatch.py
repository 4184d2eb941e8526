"""Dispatch table: fastest correct per bucket, library fallback, runtime choice."""

from __future__ import annotations

import json

import pytest

from ratchet.evaluator.kernels import (
    Dispatcher,
    bucket_of,
    build_dispatch_table,
    dispatch,
    load_dispatch,
    next_pow2,
    write_dispatch,
)
from ratchet.evaluator.kernels.dispatch import dispatch_markdown


def rec(impl, cols, time_s, ok=True, rows=64):
    return {"impl": impl, "shape": {"rows": rows, "cols": cols}, "ok": ok, "time_s": time_s if ok else None}


RESULTS = [
    # cols ~ 128: the custom kernel wins clearly
    rec("torch", 100, 10e-6), rec("custom", 100, 5e-6), rec("custom_v1", 100, 7e-6),
    rec("torch", 128, 11e-6), rec("custom", 128, 5e-6), rec("custom_v1", 128, 8e-6),
    # cols ~ 4096: custom loses
    rec("torch", 4096, 20e-6), rec("custom", 4096, 30e-6), rec("custom_v1", 4096, 25e-6),
    # cols ~ 32768: custom is fastest but wrong on one shape; v1 is correct and faster than torch
    rec("torch", 32768, 100e-6), rec("custom", 32768, 10e-6, ok=False), rec("custom_v1", 32768, 80e-6),
    rec("torch", 30000, 95e-6), rec("custom", 30000, 9e-6), rec("custom_v1", 30000, 79e-6),
    # cols ~ 1024: custom only 1% faster
    rec("torch", 1024, 10e-6), rec("custom", 1024, 9.9e-6),
]


def test_bucketing_rule():
    assert [next_pow2(n) for n in (1, 2, 3, 1000, 1024, 1025)] == [1, 2, 4, 1024, 1024, 2048]
    assert bucket_of({"rows": 64, "cols": 1000}) == "cols=1024,rows=64"
    assert bucket_of({"rows": 50, "cols": 1000}, dims=["cols"]) == "cols=1024,rows=50"


def test_table_picks_fastest_correct_and_falls_back():
    table = build_dispatch_table(RESULTS, baseline="torch", dims=["cols"], margin=0.02, device="dev-A", versions={"torch": "2.0"})
    b = table["buckets"]
    assert b["cols=128,rows=64"]["impl"] == "custom"
    assert b["cols=128,rows=64"]["speedup"] == pytest.approx((10e-6 * 11e-6) ** 0.5 / 5e-6)
    assert b["cols=4096,rows=64"]["impl"] == "torch" and b["cols=4096,rows=64"]["reason"] == "baseline is fastest"
    big = b["cols=32768,rows=64"]
    assert big["impl"] == "custom_v1"  # the fastest one failed a shape in this bucket
    assert big["candidates"]["custom"]["ok"] is False and "failed on" in big["candidates"]["custom"]["why"]
    assert b["cols=1024,rows=64"]["impl"] == "torch" and "within margin" in b["cols=1024,rows=64"]["reason"]
    assert table["device"] == "dev-A" and table["versions"] == {"torch": "2.0"}
    assert "next power of two" in table["bucket_rule"]
    json.dumps(table)  # strict JSON
    assert "| cols=128,rows=64 | custom |" in dispatch_markdown(table)


def test_all_alternatives_failing_means_baseline():
    table = build_dispatch_table([rec("lib", 64, 1e-5), rec("mine", 64, None, ok=False)], baseline="lib")
    entry = table["buckets"]["cols=64,rows=64"]
    assert entry["impl"] == "lib" and entry["reason"] == "baseline is fastest"


def test_dispatcher_chooses_by_bucket_and_falls_back(tmp_path):
    table = build_dispatch_table(RESULTS, baseline="torch", dims=["cols"], device="dev-A", versions={"torch": "2.0"})
    path = write_dispatch(table, tmp_path / "dispatch.json")
    assert load_dispatch(path) == table
    impls = {"torch": lambda x: ("torch", x), "custom": lambda x: ("custom", x), "custom_v1": lambda x: ("v1", x)}
    d = Dispatcher(path, impls)
    assert d.choose({"rows": 64, "cols": 120}) == "custom"
    assert d({"rows": 64, "cols": 3000}, 7) == ("torch", 7)
    assert d.choose({"rows": 64, "cols": 20000}) == "custom_v1"
    assert d.choose({"rows": 64, "cols": 1 << 20}) == "torch"  # bucket never measured
    assert d.choose({"rows": 3, "cols": 100}) == "torch"  # rows not bucketed: exact miss
    assert dispatch(table, impls, {"rows": 64, "cols": 100}, 1) == ("custom", 1)
    # an implementation the table names but the runtime lacks -> baseline
    assert Dispatcher(table, {"torch": impls["torch"]}).choose({"rows": 64, "cols": 100}) == "torch"


def test_stale_table_falls_back_to_baseline_everywhere():
    table = build_dispatch_table(RESULTS, baseline="torch", dims=["cols"], device="dev-A", versions={"torch": "2.0"})
    impls = {"torch": print, "custom": print, "custom_v1": print}
    other_gpu = Dispatcher(table, impls, device="dev-B")
    assert other_gpu.choose({"rows": 64, "cols": 100}) == "torch" and "dev-B" in other_gpu.stale_reason
    upgraded = Dispatcher(table, impls, device="dev-A", versions={"torch": "2.1"})
    assert upgraded.choose({"rows": 64, "cols": 100}) == "torch" and "torch 2.0 -> 2.1" in upgraded.stale_reason
    assert Dispatcher(table, impls, device="dev-A", versions={"torch": "2.0"}).choose({"rows": 64, "cols": 100}) == "custom"
    with pytest.raises(ValueError):
        Dispatcher(table, {"custom": print})
