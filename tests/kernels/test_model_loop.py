"""From the model to the kernel and back (issue 24), on CPU with real torch.

The whole loop on the bundled examples/model-cpu: `ratchet profile` (a real subprocess)
writes workload.json from torch.profiler's operator records; the example's evaluator
sweeps the GELU kernel on the shapes from it, weighted by their calls; its hold-out run
checks the model end to end with the kernel swapped in through the dispatch table, in
sandboxed children. The red-team kernels each fail where a study would reject them.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the model loop needs torch (make install puts it in .venv)")

import ratchet.evaluator.kernels as rk  # noqa: E402
from ratchet.core.errors import UserError  # noqa: E402
from ratchet.evaluator.kernels import endtoend  # noqa: E402
from ratchet.evaluator.kernels import workload as wl  # noqa: E402
from ratchet.evaluator.kernels.e2e_runner import model_runner  # noqa: E402
from ratchet.evaluator.kernels.profile import load_model_module  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "model-cpu"
RATCHET = Path(sys.executable).with_name("ratchet")

# Small and fast: three gelu shapes (rows 8, 64, 256 x 256 cols); the largest is held out.
WORKLOAD = """\
model = "model.py"
threads = 1
holdout_fraction = 0.34
steps = 20
warmup = 1

[[point]]
phase = "prefill"
batch = 1
seq = 64
weight = 0.3

[[point]]
phase = "prefill"
batch = 2
seq = 128
weight = 0.2

[[point]]
phase = "decode"
batch = 8
seq = 1
context = 256
weight = 0.5

[ops.gelu]
flops = "10 * rows * cols"
bytes = "2 * rows * cols * itemsize"
"""

KERNEL = '''\
import math
import os

import torch

assert os.getpid() != {parent}, "the kernel must never run in the evaluator's process"
_C = math.sqrt(2.0 / math.pi)


def composed(x):
    return 0.5 * x * (1.0 + torch.tanh(_C * (x + 0.044715 * torch.pow(x, 3.0))))


def fused(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


def per_row(x):
    flat = x.reshape(-1, x.shape[-1])
    return torch.stack([composed(row) for row in flat]).reshape(x.shape)


{body}
'''

HONEST = "def gelu(x):\n    return fused(x)\n"
# faster on the public (short) shapes, a per-row loop beyond 64 rows: slower on the long tail
SHORT_ONLY = "def gelu(x):\n    return fused(x) if x.numel() <= 64 * x.shape[-1] else per_row(x)\n"
# the standalone harness passes 2-D inputs; the model's activations are 3-D
SLOW_IN_MODEL = "def gelu(x):\n    return fused(x) if x.dim() == 2 else per_row(x)\n"
WRONG_IN_MODEL = "def gelu(x):\n    return fused(x) if x.dim() == 2 else fused(x.to(torch.bfloat16)).to(x.dtype)\n"
# right in eager forwards, a bf16 path only where torch.compile traces it
WRONG_COMPILED = ("def gelu(x):\n    if torch.compiler.is_compiling():\n"
                  "        return fused(x.to(torch.bfloat16)).to(x.dtype)\n    return fused(x)\n")


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "RATCHET_CACHE": str(tmp / "cache"), "MODEL_CPU_SHAPE_S": "0.2", "MODEL_CPU_E2E_S": "1.0"}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the example with this test's small workload, profiled by `ratchet profile`."""
    tree = tmp_path_factory.mktemp("model-cpu")
    for name in ("model.py", "evaluate.py", "kernel.py"):
        shutil.copy(EXAMPLE / name, tree / name)
    (tree / "workload.toml").write_text(WORKLOAD)
    proc = subprocess.run(
        [str(RATCHET), "profile", "workload.toml", "--out", "workload.json", "--holdout-dir", "holdout", "--model-md", "model.md"],
        cwd=tree, env=_env(tree), capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "operators cover" in proc.stdout and "gelu" in proc.stdout
    (tree / "profile.out").write_text(proc.stdout)
    return tree


def _kernel(tree: Path, body: str) -> None:
    (tree / "kernel.py").write_text(KERNEL.format(parent=os.getpid(), body=body))
    (tree / "kernel.py").chmod(0o644)


def _evaluate(tree: Path, *, holdout: bool) -> dict[str, object]:
    env = _env(tree)
    if holdout:
        env["RATCHET_HOLDOUT"] = str(tree / "holdout")
    proc = subprocess.run([sys.executable, "-P", "evaluate.py"], cwd=tree, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics: dict[str, object] = {}
    for line in proc.stdout.splitlines():
        name, sep, value = line.partition(": ")
        if sep:
            metrics[name] = value
    metrics["_log"] = proc.stderr
    return metrics


# -- the profile -----------------------------------------------------------------------------


def test_profile_writes_a_workload_whose_shares_add_up(study: Path) -> None:
    full = wl.load_profile(study / "holdout" / "workload.json", env={})
    public = wl.load_profile(study / "workload.json", env={})
    # The profiler's own cost is out of the times: they come from forwards profiled
    # without shapes, matched event for event with the one that recorded them. Timed
    # with shapes this mix was 3.3-4.0x the model without the profiler; now 0.9-1.6x
    # (measured on the 2-core machine at load 5-9: the two are timed one after the
    # other, so the load between them moves the ratio).
    assert all(p["forwards"] == 20 for p in full.per_point), full.per_point
    assert full.model_time_unprofiled_s and full.model_time_s < 2.5 * full.model_time_unprofiled_s, full.per_point
    # The operators' own time over the forward's, in the same forwards. At this tiny
    # model's sizes (operators of ~10 us) what they miss is real host time between the
    # calls: nn.Module calls, argument parsing, Python (measured gap by gap: 11-19% of
    # the forward; coverage 0.84-0.86 at load 5-9), reported as host time, never as an
    # operator's. The 10% holds where the operators take the time: the next test.
    assert 0.8 <= full.coverage <= 1.0 + 1e-9, [(p["label"], p["coverage"]) for p in full.per_point]
    assert sum(op.share for op in full.ops) == pytest.approx(full.coverage, rel=1e-6)
    assert full.host_s == pytest.approx(full.model_time_s - full.ops_time_s)
    assert "the rest is host time between them" in (study / "profile.out").read_text()
    gelu = full.op("gelu")
    assert gelu.kind == "model"
    assert sorted(s.shape["rows"] for s in gelu.shapes) == [8, 64, 256]
    assert all(s.shape["cols"] == 256 and s.dtypes == ["float32"] for s in gelu.shapes)
    # two blocks, one GELU each, per forward: calls per forward of the mix add up to 2
    assert gelu.calls == pytest.approx(2.0)
    assert [s.shape["rows"] for s in gelu.shapes if s.holdout] == [256]  # the largest is held out
    assert [s.shape["rows"] for s in public.op("gelu").shapes] and all(not s.holdout for s in public.op("gelu").shapes)
    assert sorted(s.shape["rows"] for s in public.op("gelu").shapes) == [8, 64]
    assert {"aten::linear", "softmax", "rms_norm"} <= {op.name for op in full.ops}
    for op in full.ops:  # every row classified on the measured roofline, with its Amdahl bound
        assert op.bound in ("compute", "memory", "overhead")
        assert op.amdahl_speedup is not None and op.amdahl_speedup >= 1.0
    gelu_md = (study / "model.md").read_text().split("### gelu")[1].split("###")[0]
    assert "rows=8," in gelu_md and "rows=64," in gelu_md and "rows=256," not in gelu_md  # no hold-out shape shown


def test_profile_shares_add_up_to_the_model_time_within_10_percent(tmp_path: Path) -> None:
    """The issue's bound: the operators' shares add up to the measured model time within
    10%, at a width where the operators, not Python between them, take the time: the
    example at width 384 (0.97 at load 8; width 256: 0.93-0.96; width 64, the study's
    above: 0.84-0.86)."""
    tree = tmp_path / "wide"
    tree.mkdir()
    shutil.copy(EXAMPLE / "model.py", tree / "model.py")
    (tree / "workload.toml").write_text(WORKLOAD)
    proc = subprocess.run(
        [str(RATCHET), "profile", "workload.toml", "--out", "workload.json", "--skip-peaks"],
        cwd=tree, env={**_env(tmp_path), "MODEL_CPU_DIM": "384"}, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    profile = wl.load_profile(tree / "workload.json", env={})
    assert profile.op("gelu").shapes[0].shape["cols"] == 4 * 384  # the wide model was profiled
    assert 0.9 <= profile.coverage <= 1.0 + 1e-9, [(p["label"], p["coverage"]) for p in profile.per_point]
    assert sum(op.share for op in profile.ops) == pytest.approx(profile.coverage, rel=1e-6)


def test_workload_json_round_trips(study: Path, tmp_path: Path) -> None:
    profile = wl.load_profile(study / "holdout" / "workload.json", env={})
    again = wl.load_profile(wl.save_profile(profile, tmp_path / "workload.json"), env={})
    assert again.to_dict() == profile.to_dict()
    # the hold-out run reads the full copy from the hidden directory, under the same name
    seen = wl.load_profile(study / "workload.json", env={"RATCHET_HOLDOUT": str(study / "holdout")})
    assert len(seen.op("gelu").shapes) == 3


def test_bad_workloads_are_one_line_errors(tmp_path: Path) -> None:
    cases = {
        'model = "m.py"\n': "declare at least one [[point]]",
        'model = "m.py"\nmode = "turbo"\n[[point]]\nbatch = 1\n': "mode 'turbo' is not one of",
        'model = "m.py"\ncolour = 1\n[[point]]\nbatch = 1\n': "unknown key(s) colour",
        'model = "m.py"\n[[point]]\nbatch = 1\nweight = -1\n': "weight must be a number > 0",
    }
    for text, message in cases.items():
        path = tmp_path / "w.toml"
        path.write_text(text)
        with pytest.raises(UserError, match=None) as info:
            wl.Workload.load(path)
        assert message in str(info.value) and "\n" not in str(info.value)
    proc = subprocess.run([str(RATCHET), "profile", str(tmp_path / "missing.toml")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "cannot read the workload" in " ".join(proc.stderr.split())


# -- the study on the workload's shapes -------------------------------------------------------------


def test_study_takes_its_shapes_and_weights_from_the_workload(study: Path) -> None:
    _kernel(study, HONEST)
    metrics = _evaluate(study, holdout=False)
    assert metrics["correct"] == "true", metrics["_log"]
    assert metrics["shapes"] == "2"  # the public shapes of workload.json, nothing typed by hand
    log = str(metrics["_log"])
    assert "cols=256,rows=8 " in log and "cols=256,rows=64 " in log and "rows=256 " not in log
    # the weighted metric, recomputed from the per-shape table and the workload's calls
    profile = wl.load_profile(study / "workload.json", env={})
    calls = {s.shape["rows"]: s.calls for s in wl.op_shapes(profile, "gelu", holdout=False)}
    base = cand = 0.0
    for line in log.splitlines():
        if line.startswith("cols=256,rows="):
            cols = line.split()
            rows = int(cols[0].split("rows=")[1])
            base += calls[rows] * float(cols[4])
            cand += calls[rows] * float(cols[5])
    assert float(metrics["weighted_speedup"]) == pytest.approx(base / cand, rel=2e-3)
    assert float(metrics["model_speedup_est"]) == pytest.approx(wl.amdahl(profile.op("gelu").share, base / cand), rel=2e-3)


# -- end to end -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.timing  # a model's wall time in pairs: 4 workers on 2 cores hid a 2.4x gain
def test_end_to_end_confirms_a_large_gain_in_a_child(tmp_path: Path) -> None:
    """A model whose own GELU is a per-row loop: the fused kernel makes it several times
    faster, and the sequential test confirms it on the paired repetitions. A model of its
    own, not the module's profiled study: alone in the serial timing pass, it built that
    study (`ratchet profile`, peaks measured) for nothing."""
    tree = tmp_path / "slow-model"
    tree.mkdir()
    tree.chmod(0o755)
    source = (EXAMPLE / "model.py").read_text()
    source += "\n\ndef _per_row_gelu(x):\n    flat = x.reshape(-1, x.shape[-1])\n    return torch.stack([gelu(r) for r in flat]).reshape(x.shape)\n\n\nOPS['gelu'] = _per_row_gelu\n"
    (tree / "model.py").write_text(source)
    _kernel(tree, HONEST)
    for path in tree.iterdir():
        path.chmod(0o644)
    workload = wl.Workload.from_dict({"model": "model.py", "threads": 1, "point": [{"phase": "prefill", "batch": 1, "seq": 128}]}, root=tree)
    result = endtoend.end_to_end(workload, [endtoend.Swap("gelu", "kernel.py", "gelu")], tree=tree, timing={"max_time_s": 3.0, "min_reps": 12})
    assert result.outcome is endtoend.Outcome.CONFIRMED, result.table()
    assert result.speedup and result.speedup > 1.5
    assert result.hits == 2 and result.fallbacks == 0  # two blocks, one GELU each
    assert "ratchet_e2e_kernel_gelu" not in sys.modules  # the kernel ran in the child (it asserts so itself)


@pytest.mark.slow
def test_dispatch_fallback_counts_and_the_childs_bucket_rule(study: Path) -> None:
    _kernel(study, HONEST)
    table = rk.build_dispatch_table(
        [{"impl": "kernel", "shape": {"rows": 8, "cols": 256}, "ok": True, "time_s": 1.0},
         {"impl": "library", "shape": {"rows": 8, "cols": 256}, "ok": True, "time_s": 2.0}],
        baseline="library",
    )
    workload = wl.Workload.load(study / "workload.toml")
    result = endtoend.end_to_end(workload, [endtoend.Swap("gelu", "kernel.py", "gelu", table)], tree=study, timing={"max_time_s": 0.3, "min_reps": 3})
    counts = {p.label: p.counts["gelu"] for p in result.points}
    assert counts["decode batch=8 context=256 seq=1"] == {"hits": 2, "fallbacks": 0}  # rows 8: the kernel's bucket
    assert counts["prefill batch=1 seq=64"] == {"hits": 0, "fallbacks": 2}  # never measured there: the library
    assert result.hits == 2 and result.fallbacks == 4
    for shape in ({"rows": 8, "cols": 256}, {"rows": 1000, "cols": 3}, {"rows": 1, "cols": 1, "tag": "x"}):
        assert model_runner.bucket_of(dict(shape)) == rk.bucket_of(shape)
        assert model_runner.bucket_of(dict(shape), ["rows"]) == rk.bucket_of(shape, ["rows"])


# -- red team: none of these is kept ---------------------------------------------------------------


@pytest.mark.slow
def test_redteam_fast_only_at_short_contexts(study: Path) -> None:
    _kernel(study, SHORT_ONLY)
    public = _evaluate(study, holdout=False)
    assert public["correct"] == "true", public["_log"]  # right everywhere, and fused on the public shapes
    held = _evaluate(study, holdout=True)
    # the hold-out shapes are the workload's largest: there it is slower, so the hold-out
    # metric regresses far beyond holdout_tolerance against the incumbent's (about 1.0)
    assert float(held["weighted_speedup"]) < 0.7, held["_log"]
    # and the model never runs it there: the dispatch table sends that bucket to the library
    assert "| cols=256,rows=256 float32 | library |" in str(held["_log"])
    assert int(held.get("e2e_fallbacks", "0")) > 0
    # the model's FLOPs utilisation before and after, and what is left to study
    assert 0 < float(held["e2e_mfu_before"]) < 1 and 0 < float(held["e2e_mfu_after"]) < 1
    left = next(line for line in str(held["_log"]).splitlines() if line.startswith("next by Amdahl bound: "))
    assert "gelu" not in left and left.count("up to") == 3


@pytest.mark.slow
def test_redteam_fast_alone_slower_in_the_model(study: Path) -> None:
    """Its fast path takes the harness's 2-D inputs; the model's activations are 3-D and
    take a per-row loop. Swapped in where a sweep would put it (everywhere), the model is
    slower, so the hold-out run fails and the kernel is not kept."""
    _kernel(study, SLOW_IN_MODEL)
    workload = wl.Workload.load(study / "workload.toml")
    result = endtoend.end_to_end(workload, [endtoend.Swap("gelu", "kernel.py", "gelu")], tree=study, timing={"max_time_s": 1.0})
    assert result.outcome is endtoend.Outcome.SLOWER and result.outcome.rejects, result.table()
    assert result.reason.startswith("slower end to end at")
    assert result.speedup is not None and result.speedup < 1.0


@pytest.mark.slow
def test_redteam_wrong_inside_the_model_only(study: Path) -> None:
    """Right on the harness's 2-D inputs, a bf16 path on the model's 3-D ones: the
    logits against the float64 model catch it."""
    _kernel(study, WRONG_IN_MODEL)
    workload = wl.Workload.load(study / "workload.toml")
    result = endtoend.end_to_end(workload, [endtoend.Swap("gelu", "kernel.py", "gelu")], tree=study, timing={"max_time_s": 0.5})
    assert result.outcome is endtoend.Outcome.WRONG and result.outcome.rejects, result.table()
    assert result.reason.startswith("wrong inside the model at") and "outside tolerance" in result.reason
    # and alone, on the inputs a kernel harness gives it, it passes every check
    with rk.CandidateProcess(study / "kernel.py") as cand:
        report = rk.check(cand.function("gelu"), lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
                          lambda shape, dtype, rng: torch.from_numpy(rng.standard_normal((shape["rows"], shape["cols"]), dtype="float32")),
                          [{"rows": 64, "cols": 256}])
    assert report.ok, report.summary()


@pytest.mark.slow
def test_end_to_end_runs_the_model_under_torch_compile_when_the_workload_says_so(tmp_path: Path) -> None:
    """mode = "compile": the children run the model under torch.compile with the kernel
    traced into it. The kernel is wrong only when traced, so the check catching it shows
    the timed, checked forwards were the compiled ones; in the eager model it is right.
    The backend is aot_eager (dynamo's capture and AOTAutograd, then torch's own kernels),
    for this test only: inductor's C++ build took 26 s per graph, cold, on the 2-core
    machine, and the test compiles three."""
    tree = tmp_path / "compiled"
    tree.mkdir()
    tree.chmod(0o755)
    shutil.copy(EXAMPLE / "model.py", tree / "model.py")
    _kernel(tree, WRONG_COMPILED)
    for path in tree.iterdir():
        path.chmod(0o644)
    point = {"phase": "decode", "batch": 8, "seq": 1, "context": 256}

    def workload(mode: str) -> wl.Workload:
        return wl.Workload.from_dict({"model": "model.py", "threads": 1, "mode": mode, "compile_backend": "aot_eager",
                                      "point": [point]}, root=tree)

    swap = [endtoend.Swap("gelu", "kernel.py", "gelu")]
    compiled = endtoend.end_to_end(workload("compile"), swap, tree=tree, timing={"max_time_s": 0.3, "min_reps": 3})
    assert compiled.mode == "compile" and compiled.outcome is endtoend.Outcome.WRONG, compiled.table()
    assert compiled.reason.startswith("wrong inside the model at decode") and "outside tolerance" in compiled.reason
    assert compiled.hits == 2  # counted on the census's eager forward: two blocks, one GELU each
    assert "ratchet_e2e_kernel_gelu" not in sys.modules  # the kernel ran in the children (it asserts so itself)
    # In one candidate child: the compiled model is built once and never recompiled (a
    # hit counter that changed on every call was a guard: after dynamo's limit of 8
    # recompiles the candidate ran eager beside a compiled baseline), and the same kernel
    # in the eager model gives the float64 model's logits.
    module = load_model_module(tree / "model.py", name="ratchet_test_compiled_model")
    inputs = module.make_inputs(point, "float32", np.random.default_rng(0))
    with torch.no_grad():
        want = module.build_model("float64", "cpu")(*(x.double() for x in inputs)).numpy()
    spec = {"tree": str(tree), "model": "model.py", "dtype": "float32", "device": "cpu", "mode": "compile",
            "compile_backend": "aot_eager", "threads": 1, "swap": {"gelu": swap[0].spec()}}
    rtol, atol = endtoend.TOLERANCES["float32"]
    with rk.CandidateProcess(endtoend.RUNNER, cwd=tree, env={**os.environ, "OMP_NUM_THREADS": "1"}) as child:
        model = child.construct("Model", spec)
        outs = [model(*inputs) for _ in range(12)]
        assert child.call(f"{model.target}.graphs") == 1
        assert child.call(f"{model.target}.census", point) == {"gelu": {"hits": 2, "fallbacks": 0}}
        eager = child.construct("Model", {**spec, "mode": "eager"})
        assert np.allclose(eager(*inputs), want, rtol=rtol, atol=atol)
    assert not np.allclose(outs[-1], want, rtol=rtol, atol=atol)  # still the compiled model at the 12th call


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="graph capture needs a CUDA device (none here)")
def test_redteam_breaks_graph_capture(tmp_path: Path) -> None:
    tree = tmp_path / "gpu"
    tree.mkdir()
    tree.chmod(0o755)
    shutil.copy(EXAMPLE / "model.py", tree / "model.py")
    body = "def gelu(x):\n    if float(x.abs().max().item()) > 1e9:\n        return composed(x)\n    return fused(x)\n"
    _kernel(tree, body)
    for path in tree.iterdir():
        path.chmod(0o644)
    workload = wl.Workload.from_dict({"model": "model.py", "device": "cuda", "mode": "cuda_graphs",
                                      "point": [{"phase": "decode", "batch": 8, "seq": 1, "context": 256}]}, root=tree)
    result = endtoend.end_to_end(workload, [endtoend.Swap("gelu", "kernel.py", "gelu")], tree=tree, timing={"max_time_s": 0.5})
    assert result.outcome is endtoend.Outcome.CAPTURE_BROKEN, result.table()
    assert "breaks graph capture" in result.reason


def test_profile_json_is_plain_json(study: Path) -> None:
    data = json.loads((study / "holdout" / "workload.json").read_text())
    assert data["format"] == wl.FORMAT and data["workload"]["threads"] == 1
    assert textwrap.dedent(WORKLOAD).count("[[point]]") == len(data["per_point"])


def test_a_gain_beyond_amdahls_bound_is_not_kept() -> None:
    """The verdict's arithmetic on measured-looking samples: a model 2x faster when the
    swapped op had 10% of its time (bound 1.11x) is implausible, however confirmed."""
    rng = __import__("random").Random(5)
    point = endtoend.PointResult(point={"phase": "decode"}, label="decode", weight=1.0, counts={"gelu": {"hits": 2, "fallbacks": 0}})
    point.baseline_samples = [0.010 * (1 + rng.uniform(-0.02, 0.02)) for _ in range(12)]
    point.candidate_samples = [0.005 * (1 + rng.uniform(-0.02, 0.02)) for _ in range(12)]
    point.baseline_s, point.candidate_s = 0.010, 0.005
    verdict = endtoend._verdict([point], "eager", 1.05, 0.01, 0.0, "", bound=1 / (1 - 0.10))
    assert verdict.outcome is endtoend.Outcome.IMPLAUSIBLE and verdict.outcome.rejects
    assert "beyond Amdahl's bound 1.111x" in verdict.reason
    plausible = endtoend._verdict([point], "eager", 1.05, 0.01, 0.0, "", bound=1 / (1 - 0.60))
    assert plausible.outcome is endtoend.Outcome.CONFIRMED


@pytest.mark.slow
def test_kept_kernels_of_one_model_are_measured_together(study: Path) -> None:
    """Gains stack or not end to end: two operators swapped at once, each counted."""
    _kernel(study, HONEST + "\n\ndef rms_norm(x, weight, eps=1e-6):\n"
                   "    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)\n")
    workload = wl.Workload.load(study / "workload.toml")
    swaps = [endtoend.Swap("gelu", "kernel.py", "gelu"), endtoend.Swap("rms_norm", "kernel.py", "rms_norm")]
    result = endtoend.end_to_end(workload, swaps, tree=study, timing={"max_time_s": 0.5})
    assert result.outcome not in (endtoend.Outcome.WRONG, endtoend.Outcome.FAILED), result.table()
    for p in result.points:  # per forward: 2 GELUs, 5 RMSNorms (2 per block and the final one)
        assert p.counts == {"gelu": {"hits": 2, "fallbacks": 0}, "rms_norm": {"hits": 5, "fallbacks": 0}}
    assert result.hits == 3 * 7 and result.speedup
