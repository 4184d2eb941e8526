#!/usr/bin/env bash
# GPU check for training research (examples/tinygpt on CUDA), for one GPU machine with no
# network. Meant to finish within 8 minutes on one H200.
#
#   bash bench/gpu_train_check.sh      # writes $OUT/summary.txt and $OUT/gpu_train_logs.tgz
#                                      # ($OUT defaults to ./gpu_train_out)
#
# 0. set-up, offline: the wheels in $WHEELS (default bench/wheels or shared/wheels, if any
#    are there) and ratchet itself go into this python with pip --no-index --no-deps
#    (PYTHONPATH is not enough: the worker drops it from a candidate's environment)
# 1. the card's bf16 matmul peak, measured once and cached ($RATCHET_CACHE) for MFU
# 2. speed: the GPU default config trained directly for $SPEED_BUDGET s (default 15):
#    tokens/s, MFU, peak memory; then the trusted evaluator on the GPU
# 3. a 2-round study (`ratchet run --rounds 2 --parallel 1`, tune over GPU_LEARNING_RATE,
#    $STUDY_BUDGET s of training per candidate, default 8): baseline val_bpb -> kept
#    (round 1 is the baseline alone, round 2 one tuned candidate)
# 4. verdicts through `ratchet submit` + `ratchet wait --json`: an architecture change
#    (MLP 2x + ReLU) must be scored (keep/discard), a look-ahead model must be rejected
#    (both eager, GPU_COMPILE = False: a new graph would cost a cold compile each)
# 5. the summary table, printed last
#
# Wheels to carry (cp312 manylinux, ~9 MB), fetched on a machine with network, e.g.:
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
#     -d bench/wheels pydantic pydantic-core annotated-types typing-inspection optuna \
#     alembic sqlalchemy colorlog mako greenlet
# Exit status: 0 every step ran and the verdicts are the expected ones, 1 otherwise,
# 77 no CUDA GPU / torch here.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${OUT:-./gpu_train_out}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
LOGS="$(mktemp -d "${TMPDIR:-/tmp}/gpu_train_logs.XXXXXX")"   # tarred into $OUT at the end
SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/gpu_train_work.XXXXXX")"
SPEED_BUDGET="${SPEED_BUDGET:-15}"
STUDY_BUDGET="${STUDY_BUDGET:-8}"
PY="${PYTHON:-$(command -v python3)}"
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
export PIP_NO_INDEX=1                                # nothing may be downloaded
export RATCHET_CACHE="$SCRATCH/cache"                # measured peaks, shared by every step
export TORCHINDUCTOR_CACHE_DIR="${TORCHINDUCTOR_CACHE_DIR:-$SCRATCH/inductor}"
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-$SCRATCH/triton}"
START=$SECONDS
status=0

log() { printf '[gpu_train_check %4ss] %s\n' "$((SECONDS - START))" "$*" | tee -a "$LOGS/check.log"; }
finish() {  # the summary table, when there is one, is the last thing printed
  log "done: status $status in $((SECONDS - START)) s; logs in $OUT/gpu_train_logs.tgz"
  tar czf "$OUT/gpu_train_logs.tgz" -C "$LOGS" . 2>/dev/null
  cp "$LOGS/check.log" "$OUT/check.log" 2>/dev/null
  [[ -s "$OUT/summary.txt" ]] && cat "$OUT/summary.txt"
  exit "$status"
}

# ---------------------------------------------------------------- 0. set-up
log "python: $PY; out: $OUT"
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)" 2>>"$LOGS/check.log"; then
  log "SKIP: no usable CUDA GPU or torch here"; status=77; finish
fi
if [[ "${SKIP_INSTALL:-0}" != 1 ]]; then  # SKIP_INSTALL=1: ratchet is installed already
  for dir in "${WHEELS:-}" "$ROOT/bench/wheels" "$ROOT/shared/wheels"; do
    if [[ -n "$dir" ]] && compgen -G "$dir/*.whl" >/dev/null; then
      log "installing the wheels in $dir"
      "$PY" -m pip install -q --no-index --no-deps --no-compile "$dir"/*.whl >>"$LOGS/setup.log" 2>&1 \
        || { log "wheel install FAILED (setup.log)"; status=1; }
      break
    fi
  done
  ( cd "$SCRATCH" && "$PY" -m pip install -q --no-index --no-deps --no-build-isolation "$ROOT" ) \
    >>"$LOGS/setup.log" 2>&1 || { log "ratchet install FAILED (setup.log)"; status=1; finish; }
fi
RATCHET=("$PY" -m ratchet.cli)
"$PY" - >"$LOGS/env.txt" 2>&1 <<'PYEOF'
import sys, torch, numpy, ratchet, ratchet.evaluator.channel, optuna, pydantic
print("python", sys.version.split()[0], "torch", torch.__version__, "numpy", numpy.__version__)
print("gpu", torch.cuda.get_device_name(0), "devices", torch.cuda.device_count())
PYEOF
rc=$?; cat "$LOGS/env.txt" | tee -a "$LOGS/check.log"
[[ $rc -eq 0 ]] || { log "imports FAILED (env.txt)"; status=1; finish; }
nvidia-smi >"$LOGS/nvidia-smi.txt" 2>&1 || true

# ---------------------------------------------------------------- 1. peak
log "step 1: bf16 matmul peak"
timeout 120 "$PY" -c "
from ratchet.evaluator.kernels.roofline import measure_peaks
p = measure_peaks('cuda', dtypes=('bfloat16',))
print(f'bf16 peak: {p.peak_flops(\"bfloat16\") / 1e12:.1f} TFLOP/s on {p.device}')
" >"$LOGS/peak.log" 2>&1 || { log "peak FAILED (peak.log)"; status=1; }
tail -1 "$LOGS/peak.log" | tee -a "$LOGS/check.log"

# ---------------------------------------------------------------- 2. speed
log "step 2: the GPU default config, ${SPEED_BUDGET}s of steps, then the evaluator"
SPEED="$SCRATCH/speed"
cp -r "$ROOT/examples/tinygpt" "$SPEED"
(
  cd "$SPEED" && export RATCHET_DATA="$SCRATCH/data" TINYGPT_TIME_BUDGET="$SPEED_BUDGET" &&
  timeout 60 "$PY" prepare.py && timeout 300 "$PY" train.py
) >"$LOGS/speed_train.log" 2>&1 || { log "speed run FAILED (speed_train.log)"; status=1; }
( cd "$SPEED" && RATCHET_DATA="$SCRATCH/data" timeout 180 "$PY" -I evaluate.py ) \
  >"$LOGS/speed_eval.log" 2>&1 || { log "evaluate FAILED (speed_eval.log)"; status=1; }
grep -E '^(device|steps|train_seconds|wall_seconds|tokens_per_sec|mfu_percent|peak_memory_gb|num_params):' \
  "$LOGS/speed_train.log" | tee -a "$LOGS/check.log"
grep -E '^(val_bpb|correct|reason|eval_seconds):' "$LOGS/speed_eval.log" | tee -a "$LOGS/check.log"

# ---------------------------------------------------------------- 3. study
log "step 3: 2-round study, ${STUDY_BUDGET}s per candidate"
STUDY="$SCRATCH/study"
cp -r "$ROOT/examples/tinygpt" "$STUDY"
rm -rf "$STUDY/data" "$STUDY/model.pt2" "$STUDY/.ratchet" "$STUDY/results.tsv"
"$PY" - "$STUDY/ratchet.toml" "$PY" <<'PYEOF'
# The study's config: this interpreter for `python`, the GPU knob for the tuner, the short
# budget passed through to train.py.
import re, sys
path, py = sys.argv[1], sys.argv[2]
text = open(path).read()
text = re.sub(r'"python ', f'"{py} ', text)
text = text.replace('timeout = "12m"', 'timeout = "12m"\nenv = ["TINYGPT_TIME_BUDGET"]')
text = text[: text.index("[tune.knobs]")] + (
    '[tune.knobs]\n"train.py:GPU_LEARNING_RATE" = { low = 3e-4, high = 3e-3, log = true }\n\n'
    '[backend]\nkind = "local"\n'
)
open(path, "w").write(text)
PYEOF
export TINYGPT_TIME_BUDGET="$STUDY_BUDGET"
(
  cd "$STUDY" && git init -q -b main && git add -A &&
  git -c user.name=gpu-check -c user.email=gpu-check@localhost commit -qm "tinygpt GPU baseline" &&
  timeout 330 "${RATCHET[@]}" run --rounds 2 --parallel 1
) >"$LOGS/study.log" 2>&1
rc=$?; log "study exit $rc"; [[ $rc -eq 0 ]] || status=1
cp "$STUDY/results.tsv" "$LOGS/results.tsv" 2>/dev/null || { log "no results.tsv"; status=1; }

# ---------------------------------------------------------------- 4. verdicts
log "step 4: an architecture change and a look-ahead model, through submit + wait"
(
  set -e
  cd "$STUDY"
  g() { git -c user.name=gpu-check -c user.email=gpu-check@localhost "$@"; }
  base="$(git rev-parse HEAD)"
  g checkout -q -b arch "$base"
  sed -i -e 's/4 \* n_embd/2 * n_embd/g' -e 's/F\.gelu(self\.fc(x))/F.relu(self.fc(x))/' \
         -e 's/^GPU_COMPILE = True/GPU_COMPILE = False/' train.py
  g commit -qam "MLP 2x + ReLU"
  arch="$(git rev-parse HEAD)"
  g checkout -q -b ahead "$base"
  sed -i -e 's/is_causal=True/is_causal=False/' -e 's/^GPU_COMPILE = True/GPU_COMPILE = False/' train.py
  g commit -qam "attention sees the future"
  ahead="$(git rev-parse HEAD)"
  g checkout -q main
  a="$("${RATCHET[@]}" submit "$arch" -m "arch: MLP 2x + ReLU" | tail -1)"
  b="$("${RATCHET[@]}" submit "$ahead" -m "lookahead" | tail -1)"
  timeout 240 "${RATCHET[@]}" wait "$a" "$b" --json > "$LOGS/verdicts.jsonl"
  "${RATCHET[@]}" logs "$b" > "$LOGS/lookahead_logs.txt" 2>&1 || true
) >"$LOGS/verdicts.log" 2>&1
rc=$?; log "verdicts exit $rc"; [[ $rc -eq 0 ]] || status=1
cp "$STUDY/results.tsv" "$LOGS/results_final.tsv" 2>/dev/null || true

# ---------------------------------------------------------------- 5. summary
"$PY" - "$LOGS" >"$OUT/summary.txt" 2>&1 <<'PYEOF'
import json, sys
from pathlib import Path
logs = Path(sys.argv[1])

def lines(name):
    path = logs / name
    out = {}
    if path.exists():
        for line in path.read_text(errors="replace").splitlines():
            key, sep, value = line.partition(": ")
            if sep and " " not in key:
                out[key] = value.strip()
    return out

train, ev = lines("speed_train.log"), lines("speed_eval.log")
print()
print("| GPU config | tokens/s | MFU % (6 x params x tokens/s / bf16 peak) | peak memory GB | params | val_bpb |")
print("|---|---|---|---|---|---|")
print(f"| {train.get('device', '-')} | {train.get('tokens_per_sec', '-')} | {train.get('mfu_percent', '-')} | "
      f"{train.get('peak_memory_gb', '-')} | {train.get('num_params', '-')} | {ev.get('val_bpb', ev.get('reason', '-'))} |")

tsv = logs / "results.tsv"
if tsv.exists():
    header, *body = tsv.read_text().splitlines()
    rows = [dict(zip(header.split("\t"), line.split("\t"))) for line in body if line.strip()]
    metric = "val_bpb"
    base = next((r for r in rows if r.get("description") == "baseline"), None)
    kept = [r for r in rows if r.get("status") == "keep"]
    best = kept[-1] if kept else None
    print()
    print(f"study (2 rounds): baseline {metric} {base[metric] if base else '-'} -> kept "
          f"{best[metric] if best else '-'} ({best['description'] if best else '-'}); "
          f"statuses: {', '.join(r['status'] for r in rows)}")
verdicts = logs / "verdicts.jsonl"
if verdicts.exists():
    print()
    print("| candidate | verdict | val_bpb | expected |")
    print("|---|---|---|---|")
    for line in verdicts.read_text().splitlines():
        v = json.loads(line)
        expected = "rejected" if v["description"] == "lookahead" else "keep or discard"
        print(f"| {v['description']} | {v['status']} | {v['metric']} | {expected} |")
    ahead = (logs / "lookahead_logs.txt")
    if ahead.exists():
        reason = [l for l in ahead.read_text(errors="replace").splitlines() if "not causal" in l]
        print(f"look-ahead reason: {reason[0].strip() if reason else '-'}")
PYEOF
if [[ -f "$LOGS/verdicts.jsonl" ]]; then
  "$PY" - "$LOGS/verdicts.jsonl" <<'PYEOF' || { log "unexpected verdicts"; status=1; }
import json, sys
v = {json.loads(l)["description"]: json.loads(l)["status"] for l in open(sys.argv[1]) if l.strip()}
ok = v.get("lookahead") == "rejected" and v.get("arch: MLP 2x + ReLU") in ("keep", "discard")
sys.exit(0 if ok else 1)
PYEOF
fi
finish
