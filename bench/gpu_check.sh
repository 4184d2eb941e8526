#!/usr/bin/env bash
# GPU check for the kernel harness, for a GPU machine with no network. Installs nothing.
#
#   bash bench/gpu_check.sh            # logs under ./gpu_out (or "$OUT" if set)
#
# 1. hardware.md and measured peaks (cached under $OUT/cache)
# 2. examples/triton-softmax/evaluate.py --holdout: correctness on every shape x dtype
#    (all guards), interleaved timing vs torch.softmax, roofline, CUDA-graph end-to-end
#    check, and a dispatch table
# 3. a short study: `ratchet run --rounds 2 --parallel 2` in a git-initialised temp copy
#    of the example (its evaluate/holdout commands get --quick, so it takes minutes)
# 4. a short table, printed last
#
# Needs a Python with torch (CUDA), triton, numpy and ratchet importable: $PYTHON, else
# ./.venv/bin/python, else python3. Exit status: 0 all steps ran and the kernel is
# correct, 1 a step failed, 77 no GPU / torch / triton here.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-./gpu_out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
if [[ -n "${PYTHON:-}" ]]; then PY="$PYTHON"
elif [[ -x "$ROOT/.venv/bin/python" ]]; then PY="$ROOT/.venv/bin/python"
else PY="$(command -v python3)"; fi
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
export PATH="$(dirname "$PY"):$PATH"            # `python` in ratchet.toml = this interpreter
export PYTHONPATH="$ROOT/src${PYTHONPATH:+:$PYTHONPATH}"
export RATCHET_CACHE="$OUT/cache"               # peaks measured once, shared by every step
export PIP_NO_INDEX=1                           # belt and braces: nothing may be downloaded
if [[ -x "$(dirname "$PY")/ratchet" ]]; then RATCHET=("$(dirname "$PY")/ratchet")
else RATCHET=("$PY" -m ratchet.cli); fi

log() { printf '[gpu_check %s] %s\n' "$(date +%H:%M:%S)" "$*" | tee -a "$OUT/gpu_check.log"; }
status=0

log "python: $PY; out: $OUT"
if ! "$PY" - >"$OUT/env.txt" 2>&1 <<'PYEOF'
import sys
import torch, triton, numpy
import ratchet.kernels as rk
print("python", sys.version.split()[0], "torch", torch.__version__, "triton", triton.__version__, "numpy", numpy.__version__)
print("cuda available", torch.cuda.is_available(), "devices", torch.cuda.device_count())
sys.exit(0 if torch.cuda.is_available() else 3)
PYEOF
then
  cat "$OUT/env.txt"; log "SKIP: no usable CUDA GPU / torch / triton / ratchet here"; exit 77
fi
cat "$OUT/env.txt" | tee -a "$OUT/gpu_check.log"
nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true

log "step 1: peaks and hardware.md"
if ! timeout 600 "$PY" -c "
import torch, ratchet.kernels as rk
p = rk.measure_peaks('cuda', dtypes=('float32', 'tf32', 'float16', 'bfloat16'))
print(p)
rk.write_hardware_md('$OUT/hardware.md')
" >"$OUT/peaks.log" 2>&1; then log "peaks FAILED (see peaks.log)"; status=1; fi

log "step 2: evaluate.py --holdout (correctness, timing, roofline, CUDA graphs, dispatch)"
( cd "$ROOT/examples/triton-softmax" && timeout 1200 "$PY" evaluate.py --holdout \
    --json "$OUT/eval.json" --dispatch "$OUT/dispatch.json" ) >"$OUT/evaluate.out" 2>"$OUT/evaluate.err"
rc=$?
log "evaluate.py exit $rc"; [[ $rc -eq 0 ]] || status=1
grep -q '^correct: true' "$OUT/evaluate.out" || { log "kernel not correct"; status=1; }

log "step 3: study (ratchet run --rounds 2 --parallel 2) in a temp copy"
STUDY="$(mktemp -d "${TMPDIR:-/tmp}/triton-softmax-study.XXXXXX")"
cp -r "$ROOT/examples/triton-softmax/." "$STUDY/"
rm -rf "$STUDY/.ratchet" "$STUDY/results.tsv" "$STUDY/__pycache__"
sed -i -e 's|^evaluate = "python evaluate.py"|evaluate = "python evaluate.py --quick"|' \
       -e 's|^holdout = "python evaluate.py --holdout"|holdout = "python evaluate.py --quick --holdout"|' "$STUDY/ratchet.toml"
(
  cd "$STUDY" && git init -q && git add -A &&
  git -c user.name=gpu-check -c user.email=gpu-check@localhost commit -qm "triton-softmax baseline" &&
  timeout 1800 "${RATCHET[@]}" run --rounds 2 --parallel 2
) >"$OUT/study.log" 2>&1
rc=$?
log "study exit $rc (dir $STUDY)"; [[ $rc -eq 0 ]] || status=1
cp "$STUDY/results.tsv" "$OUT/results.tsv" 2>/dev/null || log "no results.tsv"
( cd "$STUDY" && "${RATCHET[@]}" status --json ) >"$OUT/status.json" 2>>"$OUT/study.log" || true
cp "$STUDY/kernel.py" "$OUT/kernel.best.py" 2>/dev/null || true

log "step 4: summary"
"$PY" - "$OUT" <<'PYEOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def metrics(path):
    m = {}
    if path.exists():
        for line in path.read_text().splitlines():
            k, sep, v = line.partition(": ")
            if sep and " " not in k:
                m[k] = v
    return m
m = metrics(out / "evaluate.out")
print()
print("| check | result |")
print("|---|---|")
for key in ("correct", "speedup", "time_ms", "public_speedup", "holdout_speedup", "min_speedup", "max_speedup",
            "roofline_pct", "graph_correct", "graph_speedup", "peak_bandwidth_gbs", "shapes", "shapes_failed"):
    print(f"| {key} | {m.get(key, '-')} |")
if (out / "eval.json").exists():
    report = json.loads((out / "eval.json").read_text())["report"]
    print()
    print("| shape | dtype | set | ok | torch ms | triton ms | speedup | % roof | bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in report["results"]:
        roof = r.get("roofline") or {}
        ms = lambda t: f"{t * 1e3:.4f}" if t else "-"
        sp = f"{r['speedup']:.3f}" if r.get("speedup") else "-"
        pct = f"{roof['pct_of_bound']:.1f}" if roof.get("pct_of_bound") is not None else "-"
        shape = "x".join(str(r["shape"][k]) for k in ("rows", "cols"))
        print(f"| {shape} | {r['dtype']} | {'holdout' if r['holdout'] else 'public'} | {'yes' if r['correct'] else 'NO'} | "
              f"{ms(r.get('baseline_time_s'))} | {ms(r.get('time_s'))} | {sp} | {pct} | {roof.get('bound', '-')} |")
tsv = out / "results.tsv"
if tsv.exists():
    print()
    rows = [line.split("\t") for line in tsv.read_text().splitlines() if line.strip()]
    print("| " + " | ".join(rows[0]) + " |")
    print("|" + "---|" * len(rows[0]))
    for row in rows[1:]:
        print("| " + " | ".join(row) + " |")
PYEOF
log "done: status $status; logs in $OUT"
exit $status
