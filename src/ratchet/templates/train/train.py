"""Train a tiny byte-level GPT for a fixed wall-clock budget, then save it to model.pt.

This is the file the research agent edits. The knobs below are plain `NAME = literal`
assignments so a tuner can rewrite them. evaluate.py rebuilds the model from the
hyperparameters saved in model.pt using its own copy of the GPT class below, so the
architecture itself is fixed: what can change is how well these weights get trained.

    python train.py                          # 30 s budget, default knobs
    TINYGPT_TIME_BUDGET=3 python train.py    # a quick smoke run
"""

import math
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------- knobs
# Seconds of training (the loop's wall clock, not counting start-up). Fixed by the rules.
TIME_BUDGET = 30
# Deliberately low: a tuner should find a better one.
LEARNING_RATE = 1e-4
# Model width (must be divisible by N_HEAD).
N_EMBD = 64
# Number of transformer blocks.
N_LAYER = 2
N_HEAD = 4
# Context length in bytes.
BLOCK_SIZE = 128
# Sequences per optimizer step.
BATCH_SIZE = 16
WEIGHT_DECAY = 0.1
WARMUP_STEPS = 20
GRAD_CLIP = 1.0
SEED = 1337
LOG_EVERY = 50


# ---------------------------------------------------------------- model
# Keep this section identical to the copy in evaluate.py: the saved state dict must load there.
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


# ---------------------------------------------------------------- training
def init_weights(model: GPT, n_layer: int) -> None:
    for name, p in model.named_parameters():
        if p.dim() >= 2:
            # GPT-2 style: residual projections scaled down by depth.
            std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("proj.weight") else 0.02
            nn.init.normal_(p, mean=0.0, std=std)
        elif name.endswith("bias"):
            nn.init.zeros_(p)


def get_batch(data: np.ndarray, rng: np.random.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    starts = rng.integers(0, len(data) - BLOCK_SIZE - 1, size=BATCH_SIZE)
    chunk = np.stack([data[s : s + BLOCK_SIZE + 1] for s in starts]).astype(np.int64)
    chunk = torch.from_numpy(chunk)
    return chunk[:, :-1], chunk[:, 1:]


def lr_at(step: int) -> float:
    # Linear warm-up, then constant: with a time budget the total step count is unknown.
    return LEARNING_RATE * min(1.0, (step + 1) / WARMUP_STEPS)


def main() -> None:
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    time_budget = float(os.environ.get("TINYGPT_TIME_BUDGET", TIME_BUDGET))
    torch.manual_seed(SEED)
    rng = np.random.default_rng(SEED)

    data_dir = Path(os.environ.get("RATCHET_DATA") or "data")
    train_path = data_dir / "train.bin"
    if not train_path.is_file():
        raise SystemExit(f"train.py: {train_path} not found; run `python prepare.py` first")
    train_data = np.fromfile(train_path, dtype=np.uint8)

    config = dict(
        vocab_size=256, block_size=BLOCK_SIZE, n_layer=N_LAYER, n_head=N_HEAD, n_embd=N_EMBD
    )
    model = GPT(**config)
    init_weights(model, N_LAYER)
    n_params = sum(p.numel() for p in model.parameters())
    # Weight decay on matrices and embeddings only, not on biases or layer-norm gains.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=LEARNING_RATE,
        betas=(0.9, 0.95),
    )
    print(f"params: {n_params:,}  config: {config}  threads: {torch.get_num_threads()}")
    print(f"lr: {LEARNING_RATE}  batch: {BATCH_SIZE}  budget: {time_budget:g}s")

    model.train()
    step, t0 = 0, time.perf_counter()
    smooth_loss = None
    while time.perf_counter() - t0 < time_budget:
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        x, y = get_batch(train_data, rng)
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        value = loss.item()
        smooth_loss = value if smooth_loss is None else 0.9 * smooth_loss + 0.1 * value
        if step % LOG_EVERY == 0:
            elapsed = time.perf_counter() - t0
            print(f"step {step:5d} | loss {value:.4f} | {elapsed:6.1f}s", flush=True)
        step += 1
    train_seconds = time.perf_counter() - t0

    torch.save(
        {
            "config": config,
            "model": model.state_dict(),
            "train_seconds": train_seconds,
            "steps": step,
        },
        "model.pt",
    )
    print("---")
    print(f"steps: {step}")
    print(f"train_seconds: {train_seconds:.1f}")
    print(f"final_loss_bpb: {smooth_loss / math.log(2):.4f}")
    print(f"num_params: {n_params}")
    print("saved: model.pt")


if __name__ == "__main__":
    main()
