#!/usr/bin/env bash
# The model loop on one GPU (issue 24): meant to finish within 8 minutes on one H200, no
# network. Prints the profile table of a GPT-2-small-sized model (examples/model-cpu at
# width 768, 12 heads, 12 layers, vocabulary 50257; random weights) under a decode-heavy
# workload with CUDA graphs in bf16, the end-to-end result of the fused-GELU kernel
# (the example's hold-out run: sweep, dispatch table, the model with and without it
# under CUDA graphs), and the graph-capture red-team verdict.
#   bash bench/gpu_model_check.sh 2>&1 | tee /tmp/gpu_model_check.log
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PY=${PYTHON:-$ROOT/.venv/bin/python}
RATCHET=${RATCHET:-$ROOT/.venv/bin/ratchet}
"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else "no CUDA device: this check needs one GPU")'
work=$(mktemp -d /tmp/gpu-model-check.XXXXXX)
chmod 755 "$work"
cp examples/model-cpu/model.py examples/model-cpu/evaluate.py examples/model-cpu/kernel.py "$work"/
cat > "$work/workload.toml" <<'TOML'
model = "model.py"
device = "cuda"
dtype = "bfloat16"
mode = "cuda_graphs"
holdout_fraction = 0.34
steps = 20
warmup = 3

[[point]]
phase = "prefill"
batch = 1
seq = 1024
weight = 0.05

[[point]]
phase = "decode"
batch = 32
seq = 1
context = 1024
weight = 0.6

[[point]]
phase = "decode"
batch = 32
seq = 1
context = 4096
weight = 0.35

[ops.gelu]
flops = "10 * rows * cols"
bytes = "2 * rows * cols * itemsize"

[ops.rms_norm]
flops = "4 * rows * cols"
bytes = "2 * rows * cols * itemsize + cols * itemsize"

[ops.softmax]
flops = "5 * rows * cols"
bytes = "2 * rows * cols * itemsize"
TOML
chmod 644 "$work"/*
export MODEL_CPU_DIM=768 MODEL_CPU_HEADS=12 MODEL_CPU_LAYERS=12 MODEL_CPU_VOCAB=50257
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
echo "== 1. profile (GPT-2-small sizes, decode-heavy, CUDA graphs, bf16)"
(cd "$work" && timeout 180 "$RATCHET" profile workload.toml --out workload.json --holdout-dir holdout)
echo "== 2. the fused GELU: hold-out sweep, dispatch table, the model end to end under CUDA graphs"
sed -i 's/^IMPL = "composed"/IMPL = "fused"/' "$work/kernel.py"
(cd "$work" && RATCHET_HOLDOUT="$work/holdout" MODEL_CPU_SHAPE_S=0.5 MODEL_CPU_E2E_S=3 timeout 240 "$PY" -P evaluate.py 2>&1 | tail -40)
echo "== 3. red team: a kernel that breaks graph capture"
timeout 120 "$PY" -m pytest -q -m gpu tests/kernels/test_model_loop.py -k graph_capture
