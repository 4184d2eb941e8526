"""Score model.pt on the validation bytes. Protected and trusted: candidates may not change it.

Rebuilds the GPT from the hyperparameters saved in model.pt with this file's own copy of the
model code (never train.py's, which the candidate controls), loads the weights strictly, and
reports bits per byte on a fixed stretch of the val split (or the holdout split):

    python evaluate.py              # val_bpb: 2.345678 ...
    python evaluate.py --holdout    # same metric name, holdout bytes

Output is `name: value` lines. A checkpoint that does not fit this architecture, or whose
score is not finite, prints `correct: false` (exit 0, the reason on stderr): the candidate is
rejected, not crashed. A missing or unreadable model.pt exits 1.
"""

import argparse
import math
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# Score exactly this many bytes, whatever the model's context length: every candidate is
# measured on the same targets. 128 KiB keeps evaluation to a few seconds on one CPU core.
EVAL_BYTES = 128 * 1024
WINDOWS_PER_BATCH = 64
VOCAB_SIZE = 256
CONFIG_KEYS = ("vocab_size", "block_size", "n_layer", "n_head", "n_embd")
# Bounds on the architecture, so a candidate cannot make evaluation arbitrarily expensive.
LIMITS = {"block_size": 4096, "n_layer": 48, "n_head": 64, "n_embd": 2048}
MAX_PARAMS = 200_000_000


# ---------------------------------------------------------------- model
# The reference architecture. train.py holds a copy; this one is the one that counts.
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size: int, block_size: int, n_layer: int, n_head: int, n_embd: int):
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Logits of shape (B, T, vocab_size) for a (B, T) batch of byte ids."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ---------------------------------------------------------------- checks
class Rejected(Exception):
    """The checkpoint is not a model this evaluator can honestly score."""


def check_config(config: object) -> dict[str, int]:
    if not isinstance(config, dict) or set(config) != set(CONFIG_KEYS):
        keys = sorted(config) if isinstance(config, dict) else type(config).__name__
        raise Rejected(f"config must have exactly the keys {list(CONFIG_KEYS)}, got {keys}")
    for key in CONFIG_KEYS:
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise Rejected(f"config[{key!r}] must be a positive int, got {value!r}")
        if value > LIMITS.get(key, value):
            raise Rejected(f"config[{key!r}] = {value} is over the limit {LIMITS[key]}")
    if config["vocab_size"] != VOCAB_SIZE:
        raise Rejected(f"vocab_size must be {VOCAB_SIZE} (bytes), got {config['vocab_size']}")
    if config["n_embd"] % config["n_head"]:
        raise Rejected(f"n_embd {config['n_embd']} is not divisible by n_head {config['n_head']}")
    return {key: config[key] for key in CONFIG_KEYS}


def build_model(checkpoint: object) -> GPT:
    if not isinstance(checkpoint, dict) or "config" not in checkpoint or "model" not in checkpoint:
        raise Rejected("model.pt must be a dict with 'config' and 'model' (a state dict)")
    config = check_config(checkpoint["config"])
    model = GPT(**config)
    n_params = sum(p.numel() for p in model.parameters())
    if n_params > MAX_PARAMS:
        raise Rejected(f"{n_params:,} parameters is over the limit {MAX_PARAMS:,}")
    try:
        # strict: every tensor must be there with the right shape, and nothing extra.
        model.load_state_dict(checkpoint["model"], strict=True)
    except (RuntimeError, TypeError, AttributeError) as err:
        first = str(err).strip().splitlines()
        detail = " ".join(line.strip() for line in first[:4])
        raise Rejected(f"weights do not match the evaluator's GPT{config}: {detail}") from None
    return model


# ---------------------------------------------------------------- scoring
@torch.no_grad()
def bits_per_byte(model: GPT, data: np.ndarray) -> float:
    """Mean cross-entropy in bits over the targets data[1 : EVAL_BYTES + 1].

    The bytes are cut into consecutive, non-overlapping windows of the model's context length
    (the last one shorter), so the scored targets are the same for every model.
    """
    if len(data) < EVAL_BYTES + 1:
        raise SystemExit(f"evaluate.py: split has {len(data)} bytes, need {EVAL_BYTES + 1}")
    tokens = torch.from_numpy(data[: EVAL_BYTES + 1].astype(np.int64))
    T = model.block_size
    n_full = EVAL_BYTES // T
    batches = [
        (range(i, min(i + WINDOWS_PER_BATCH, n_full)), T)
        for i in range(0, n_full, WINDOWS_PER_BATCH)
    ]
    if EVAL_BYTES % T:  # the short last window
        batches.append((range(n_full, n_full + 1), EVAL_BYTES % T))
    total_nats = 0.0
    for windows, length in batches:
        x = torch.stack([tokens[w * T : w * T + length] for w in windows])
        y = torch.stack([tokens[w * T + 1 : w * T + length + 1] for w in windows])
        logits = model(x).float()
        total_nats += F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum"
        ).item()
    return total_nats / EVAL_BYTES / math.log(2)


def peak_memory_gb() -> float:
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return rss / (1024**3 if sys.platform == "darwin" else 1024**2)


def reject(reason: str) -> None:
    print(f"evaluate.py: rejected: {reason}", file=sys.stderr)
    print("correct: false")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--holdout", action="store_true", help="score the holdout split")
    parser.add_argument("--model", default="model.pt", help="checkpoint path (default model.pt)")
    args = parser.parse_args()
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))

    model_path = Path(args.model)
    if not model_path.is_file():
        sys.exit(f"evaluate.py: {model_path} not found (did train.py finish and save it?)")
    split = "holdout" if args.holdout else "val"
    data_path = Path(os.environ.get("RATCHET_DATA") or "data") / f"{split}.bin"
    if not data_path.is_file():
        sys.exit(f"evaluate.py: {data_path} not found; run `python prepare.py` first")
    data = np.fromfile(data_path, dtype=np.uint8)

    try:
        # weights_only: plain tensors and containers, never arbitrary pickled code.
        checkpoint = torch.load(model_path, map_location="cpu", weights_only=True)
    except Exception as err:  # any unreadable file is the same failure
        sys.exit(f"evaluate.py: cannot read {model_path}: {type(err).__name__}: {err}")

    try:
        model = build_model(checkpoint)
    except Rejected as err:
        reject(str(err))
        return
    model.eval()
    t0 = time.perf_counter()
    bpb = bits_per_byte(model, data)
    eval_seconds = time.perf_counter() - t0
    if not math.isfinite(bpb):
        reject(f"{split} bits per byte is not finite ({bpb})")
        return

    print("---")
    print(f"val_bpb: {bpb:.6f}")
    print("correct: true")
    print(f"memory_gb: {peak_memory_gb():.3f}")
    print(f"num_params: {sum(p.numel() for p in model.parameters())}")
    train_seconds = checkpoint.get("train_seconds")
    if isinstance(train_seconds, int | float) and not isinstance(train_seconds, bool):
        print(f"train_seconds: {float(train_seconds):.1f}")
    print(f"eval_seconds: {eval_seconds:.1f}")
    print(f"eval_bytes: {EVAL_BYTES}")


if __name__ == "__main__":
    main()
