#!/usr/bin/env bash
# GPU check for the two-process kernel harness, on one GPU machine with no network.
# Budget: under 8 minutes on one H200. Recipe: /work/shared/notes/gpu-device.md.
#
#   OUT=/some/dir bash bench/gpu_check.sh      # default OUT: ./gpu_out
#
# 0. install: wheels carried in $WHEELS (default: shared/wheels, else bench/wheels) for what
#    the image lacks (pydantic, optuna, ...), then ratchet itself, all --no-index
# 1. peaks + hardware.md (cached under $OUT/cache, shared by every later step)
# 2. timing agreement: ratchet's timings (child process, host clock around N calls / one
#    CUDA-graph replay) against triton.testing.do_bench (bandwidth-bound, target 5%) and
#    do_bench_cudagraph (launch-bound, target 10%), for torch.softmax and the example's
#    kernel, plus the A/B speedup on a bandwidth-bound shape
# 3. examples/triton-softmax/evaluate.py --holdout: per-shape table with bottleneck classes,
#    a dispatch table
# 4. a 2-round study (`ratchet run --rounds 2 --parallel 2`, evaluations --quick) in a
#    git-initialised temp copy of the example
# 5. the GPU-marked red-team tests (side-stream work, CUDA IPC) and issue 21's GPU forms
#    (tests/kernels/test_redteam_child_gpu.py): a child that slows the empty requests the
#    clock's correction comes from, a setsid'd helper queueing work in its own CUDA context
#    while the baseline is timed, side-stream work left running into the baseline; the
#    confined child's CUDA IPC across uids (test_isolate's IPC test runs it confined)
# 6. a short summary table, printed last; every log tarred into $OUT/gpu_check_logs.tgz
#    (only a few files come back from the device machine)
#
# Exit status: 0 every step ran and passed, 1 a step failed, 77 no usable GPU here.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
PY="${PYTHON:-$(command -v python3)}"
export PATH="$(dirname "$PY"):$PATH"            # `python` in ratchet.toml = this interpreter
export RATCHET_CACHE="$OUT/cache"               # peaks measured once, shared by every step
export PIP_NO_INDEX=1                           # nothing may be downloaded
STARTED=$(date +%s)
status=0
log() { printf '[gpu_check %4ss] %s\n' "$(( $(date +%s) - STARTED ))" "$*" | tee -a "$LOGS/gpu_check.log"; }
finish() {
  tar -czf "$OUT/gpu_check_logs.tgz" -C "$OUT" logs 2>/dev/null || true
  log "done: status $status; logs in $OUT/gpu_check_logs.tgz"
}
trap finish EXIT

log "step 0: install (no network)"
WHEELS="${WHEELS:-}"
for candidate in "$ROOT/shared/wheels" "$ROOT/bench/wheels"; do
  [[ -z "$WHEELS" && -d "$candidate" ]] && WHEELS="$candidate"
done
if [[ -n "$WHEELS" ]] && compgen -G "$WHEELS/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile "$WHEELS"/*.whl >"$LOGS/install.log" 2>&1 \
    || log "wheel install reported an error (see install.log)"
fi
( cd "$ROOT" && "$PY" -m pip install -q --no-index --no-deps --no-build-isolation . ) >>"$LOGS/install.log" 2>&1 \
  || { log "installing ratchet FAILED (see install.log)"; status=1; exit 1; }
RATCHET=("$PY" -m ratchet.cli)
if ! "$PY" - >"$LOGS/env.txt" 2>&1 <<'PYEOF'
import sys
import torch, triton, numpy
import ratchet.evaluator.kernels as rk
print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__)
print("cuda available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
print("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "-")
sys.exit(0 if torch.cuda.is_available() else 3)
PYEOF
then
  cat "$LOGS/env.txt"; log "SKIP: no usable CUDA GPU / torch / triton / ratchet here"; status=77; exit 77
fi
tee -a "$LOGS/gpu_check.log" <"$LOGS/env.txt"
nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1 || true

log "step 1: peaks and hardware.md"
timeout 120 "$PY" - "$LOGS" >"$LOGS/peaks.log" 2>&1 <<'PYEOF' || { log "peaks FAILED (see peaks.log)"; status=1; }
import sys, torch, ratchet.evaluator.kernels as rk
p = rk.measure_peaks("cuda", dtypes=("float32", "float16", "bfloat16"))
print(p)
rk.write_hardware_md(f"{sys.argv[1]}/hardware.md")
PYEOF

log "step 2: timing agreement with triton.testing.do_bench / do_bench_cudagraph"
timeout 150 "$PY" - "$ROOT/examples/triton-softmax" "$LOGS/agreement.json" >"$LOGS/agreement.log" 2>&1 <<'PYEOF' || { log "agreement FAILED (see agreement.log)"; status=1; }
import importlib.util, json, sys
import numpy as np
import torch
import triton.testing as tt
import ratchet.evaluator.kernels as rk

example, dest = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("kernel_for_agreement", f"{example}/kernel.py")
kernel = importlib.util.module_from_spec(spec)
spec.loader.exec_module(kernel)  # this script's own copy, for the standard tools' timings

def make(shape, dtype, rng):
    g = torch.Generator(device="cuda").manual_seed(int(rng.integers(2**62)))
    return torch.randn(shape["rows"], shape["cols"], device="cuda", dtype=getattr(torch, dtype), generator=g)

def ref(x):
    return torch.softmax(x, -1)

def out(shape, dtype, inputs):
    return torch.empty_like(inputs[0])

cases = [("launch-bound", {"rows": 32, "cols": 1024}, True, 0.10),
         ("bandwidth-bound", {"rows": 16384, "cols": 8192}, False, 0.05)]
rows = []
with rk.CandidateProcess(f"{example}/kernel.py") as cand:
    for cls, shape, graph, target in cases:
        x = make(shape, "bfloat16", np.random.default_rng(0))
        y = torch.empty_like(x)
        tool = tt.do_bench_cudagraph if graph else tt.do_bench
        tool_name = "do_bench_cudagraph" if graph else "do_bench"
        opts = {"cuda_graph": graph, "max_time_s": 2.0, "min_reps": 10, "warmup": 2, "target_sem": 0.005}
        for impl, ours, theirs in (
            # out= for torch too: a trusted function is then called plainly (no copy into a buffer)
            ("torch.softmax", lambda: rk.bench(lambda t: torch.softmax(t, -1), make, shape, "bfloat16", reference=ref, out=out, **opts),
             lambda: tool(lambda: torch.softmax(x, -1))),
            ("triton kernel", lambda: rk.bench(cand.function("softmax"), make, shape, "bfloat16", reference=ref, out=out, **opts),
             lambda: tool(lambda: kernel.softmax(x, y))),
        ):
            r = ours()
            t_ms = float(theirs())
            ratio = r.median_s * 1e3 / t_ms
            rows.append({"class": cls, "impl": impl, "shape": rk.shape_key(shape), "ratchet_us": r.median_s * 1e6,
                         "tool": tool_name, "tool_us": t_ms * 1e3, "ratio": ratio, "target": target,
                         "ok": r.ok and abs(ratio - 1) <= target, "sem_pct": r.sem_rel * 100,
                         "host_overhead_us_per_call": r.host_overhead_per_call_s * 1e6, "calls": r.calls,
                         "reasons": r.reasons})
            print(rows[-1], flush=True)
    shape = {"rows": 16384, "cols": 8192}
    cmp = rk.compare(lambda t: torch.softmax(t, -1), cand.function("softmax"), make, shape, "bfloat16", reference=ref, out=out, max_time_s=2.0)
    x = make(shape, "bfloat16", np.random.default_rng(1))
    y = torch.empty_like(x)
    tool_speedup = tt.do_bench(lambda: torch.softmax(x, -1)) / tt.do_bench(lambda: kernel.softmax(x, y))
    rows.append({"class": "A/B speedup", "impl": "triton vs torch", "shape": rk.shape_key(shape), "ratchet_speedup": cmp.speedup,
                 "tool": "do_bench", "tool_speedup": tool_speedup, "ratio": cmp.speedup / tool_speedup, "target": 0.05,
                 "ok": cmp.ok and abs(cmp.speedup / tool_speedup - 1) <= 0.05})
    print(rows[-1], flush=True)
json.dump(rows, open(dest, "w"), indent=2, default=str)
sys.exit(0 if all(r["ok"] for r in rows) else 1)
PYEOF

log "step 3: evaluate.py --holdout (per-shape table, bottleneck classes, dispatch table)"
( cd "$ROOT/examples/triton-softmax" && timeout 180 "$PY" evaluate.py --holdout \
    --json "$LOGS/eval.json" --dispatch "$LOGS/dispatch.json" ) >"$LOGS/evaluate.out" 2>"$LOGS/evaluate.err"
rc=$?
log "evaluate.py exit $rc"; [[ $rc -eq 0 ]] || status=1
grep -q '^correct: true' "$LOGS/evaluate.out" || { log "kernel not correct"; status=1; }

elapsed() { echo $(( $(date +%s) - STARTED )); }
BUDGET=${BUDGET:-450}   # seconds; the later steps are cut short so the whole check ends within 8 minutes
left() { local l=$(( BUDGET - $(elapsed) )); (( l > 30 )) && echo "$l" || echo 30; }

log "step 4: study (ratchet run --rounds 2 --parallel 2, evaluations --quick) in a temp copy"
STUDY="$(mktemp -d "${TMPDIR:-/tmp}/triton-softmax-study.XXXXXX")"
cp -r "$ROOT/examples/triton-softmax/." "$STUDY/"
rm -rf "$STUDY/.ratchet" "$STUDY/results.tsv" "$STUDY/__pycache__"
sed -i -e 's|^evaluate = "python -P evaluate.py"|evaluate = "python -P evaluate.py --quick"|' \
       -e 's|^holdout = "python -P evaluate.py --holdout"|holdout = "python -P evaluate.py --quick --holdout"|' "$STUDY/ratchet.toml"
grep -q -- '--quick' "$STUDY/ratchet.toml" || log "WARNING: could not switch the study's evaluations to --quick"
(
  cd "$STUDY" && git init -q && git add -A &&
  git -c user.name=gpu-check -c user.email=gpu-check@localhost commit -qm "triton-softmax baseline" &&
  timeout "$(( $(left) > 180 ? 180 : $(left) ))" "${RATCHET[@]}" run --rounds 2 --parallel 2
) >"$LOGS/study.log" 2>&1
rc=$?
log "study exit $rc (dir $STUDY)"; [[ $rc -eq 0 ]] || status=1
cp "$STUDY/results.tsv" "$LOGS/results.tsv" 2>/dev/null || log "no results.tsv"

log "step 5: GPU red-team tests (pytest -m gpu)"
( cd "$ROOT" && timeout "$(( $(left) > 150 ? 150 : $(left) ))" "$PY" -m pytest -q -m gpu -rA -p no:cacheprovider \
    tests/kernels/test_redteam_kernels.py tests/kernels/test_redteam_child_gpu.py tests/test_isolate.py ) >"$LOGS/redteam.log" 2>&1
rc=$?
log "red-team exit $rc"; [[ $rc -eq 0 ]] || status=1

log "step 6: summary"
"$PY" - "$LOGS" <<'PYEOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
logs = Path(sys.argv[1])
print()
print("## timing agreement (ratchet vs triton.testing; targets: graph 10%, bandwidth 5%)")
print("| class | impl | shape | ratchet | tool | tool value | ratio | ok |")
print("|---|---|---|---|---|---|---|---|")
try:
    for r in json.loads((logs / "agreement.json").read_text()):
        if "ratchet_us" in r:
            print(f"| {r['class']} | {r['impl']} | {r['shape']} | {r['ratchet_us']:.2f} us | {r['tool']} | {r['tool_us']:.2f} us | {r['ratio']:.3f} | {r['ok']} |")
        else:
            print(f"| {r['class']} | {r['impl']} | {r['shape']} | {r['ratchet_speedup']:.3f}x | {r['tool']} | {r['tool_speedup']:.3f}x | {r['ratio']:.3f} | {r['ok']} |")
except (OSError, ValueError) as exc:
    print(f"| (no agreement results: {exc}) |")
m = {}
if (logs / "evaluate.out").exists():
    for line in (logs / "evaluate.out").read_text().splitlines():
        k, sep, v = line.partition(": ")
        if sep and " " not in k:
            m[k] = v
print()
print("## examples/triton-softmax --holdout: " + ", ".join(f"{k} {m[k]}" for k in (
    "correct", "speedup", "speedup_sem", "decode_speedup", "prefill_speedup", "holdout_speedup", "roofline_pct",
    "host_overhead_us", "peak_bandwidth_gbs", "reason") if k in m))
if (logs / "eval.json").exists():
    report = json.loads((logs / "eval.json").read_text())["report"]
    print("| shape | dtype | set | ok | torch us | triton us | speedup | % roof | bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in report["results"]:
        roof = r.get("roofline") or {}
        us = lambda t: f"{t * 1e6:.2f}" if t else "-"
        sp = f"{r['speedup']:.3f}" if r.get("speedup") else "-"
        pct = f"{roof['pct_of_bound']:.1f}" if roof.get("pct_of_bound") is not None else "-"
        shape = "x".join(str(r["shape"][k]) for k in ("rows", "cols"))
        print(f"| {shape} | {r['dtype']} | {'holdout' if r['holdout'] else 'public'} | {'yes' if r['correct'] else 'NO'} | "
              f"{us(r.get('baseline_time_s'))} | {us(r.get('time_s'))} | {sp} | {pct} | {roof.get('bound', '-')} |")
tsv = logs / "results.tsv"
print()
print("## 2-round study (results.tsv)")
if tsv.exists():
    for line in tsv.read_text().splitlines():
        print("    " + line)
else:
    print("    (no results.tsv)")
print()
print("## red-team (GPU-marked tests)")
if (logs / "redteam.log").exists():
    for line in (logs / "redteam.log").read_text().splitlines():
        if line.startswith(("PASSED", "FAILED", "SKIPPED", "ERROR")) or " passed" in line or " failed" in line:
            print("    " + line)
PYEOF
exit $status
