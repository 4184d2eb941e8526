"""Train a tiny byte-level GPT for a fixed training-time budget, then export it to model.pt2.

This is the file the research agent edits: the knobs, the model, the optimizer, the loop.
The architecture is free. What the trusted evaluate.py scores is the exported program
(`torch.export`), a graph of aten operations that it runs without importing this file:

    python train.py                          # default knobs (30 s on a CPU, 300 s on a GPU)
    TINYGPT_TIME_BUDGET=3 python train.py    # a quick smoke run

On a CUDA GPU it trains the GPU_* sizes with bf16 autocast, fused attention
(scaled_dot_product_attention) and torch.compile; on a CPU, the small sizes, eagerly.
The budget counts training steps only (not start-up, compilation or the export), and the
first UNTIMED_STEPS steps, where torch.compile compiles, are not counted either.
"""

import contextlib
import json
import math
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

# ---------------------------------------------------------------- knobs
# Seconds of training on a CPU (the timed steps, not start-up). Fixed by the rules.
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
PROGRESS_EVERY = 5  # steps between reports on ratchet's progress pipe
# On a CUDA GPU these replace the CPU values above: a model big enough to keep an
# H100/H200 busy (about 100M parameters, 64K tokens per step), karpathy's 5-minute budget.
GPU_TIME_BUDGET = 300
GPU_LEARNING_RATE = 6e-4
GPU_N_EMBD = 1024
GPU_N_LAYER = 8
GPU_N_HEAD = 8
GPU_BLOCK_SIZE = 1024
GPU_BATCH_SIZE = 64
GPU_COMPILE = True
# Steps not counted against the budget (torch.compile compiles in the first ones).
UNTIMED_STEPS = 3
# Sequences per call of the exported program (the evaluator feeds it this many at a time).
EXPORT_BATCH = 16


# ---------------------------------------------------------------- model
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
        # Flash / memory-efficient attention where the device has it.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        # reshape, not .contiguous().view(): export would drop a no-op .contiguous(), and
        # other devices' attention kernels return other strides.
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


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


def get_batch(
    data: torch.Tensor, block_size: int, batch_size: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of the training bytes, drawn on the data's device (no host sync)."""
    starts = torch.randint(
        0, len(data) - block_size - 1, (batch_size, 1), generator=gen, device=data.device
    )
    chunk = data[starts + torch.arange(block_size + 1, device=data.device)].long()
    return chunk[:, :-1], chunk[:, 1:]


def peak_bf16_flops(device: torch.device) -> float:
    """The card's measured bf16 matmul peak (for MFU), cached by ratchet where it can be."""
    try:
        from ratchet.kernels.roofline import measure_peaks

        return measure_peaks(str(device), dtypes=("bfloat16",)).peak_flops("bfloat16")
    except ImportError:  # run without ratchet installed: measure it here
        n = 8192
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
        best = math.inf
        for _ in range(6):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            torch.cuda.synchronize(device)
            best = min(best, start.elapsed_time(end) / 1e3)
        return 2.0 * n**3 / best


def export_program(model: GPT, block_size: int, path: str, meta: dict) -> None:
    """Save the trained model as a torch.export program: float32, on the CPU.

    The evaluator moves it to its own device. Exporting the plain module (not the compiled
    wrapper) keeps the graph to portable aten operations.
    """
    model = model.to("cpu", torch.float32).eval()
    example = torch.zeros(EXPORT_BATCH, block_size, dtype=torch.long)
    program = torch.export.export(model, (example,))
    torch.export.save(program, path, extra_files={"train.json": json.dumps(meta)})


def check_compile_caches() -> None:
    """Use the study's shared compile caches, or a private one where they cannot be written.

    ratchet points TORCHINDUCTOR_CACHE_DIR / TRITON_CACHE_DIR at caches shared by the
    study's candidates, so the second one to compile the same graph finds it built. Where
    such a directory is not writable here, torch would fail on first use (even on a CPU):
    compile into a private directory instead, and say so.
    """
    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        path = os.environ.get(var)
        if not path:
            continue
        try:
            os.makedirs(path, exist_ok=True)
            writable = os.access(path, os.W_OK)
        except OSError:
            writable = False
        if not writable:
            os.environ[var] = tempfile.mkdtemp(prefix=f"{var.lower()}-")
            print(f"train.py: {var}={path} is not writable here; using {os.environ[var]}")


def progress_reporter():
    """ratchet's progress pipe ($RATCHET_PROGRESS_FD): one `<step> <value>` line per
    report, so a run clearly worse than the incumbent's at the same point is stopped early
    (docs/statistics.md). Here the step is the timed seconds (the budget every run has)
    and the value the smoothed training loss. A no-op when run by hand."""
    fd = os.environ.get("RATCHET_PROGRESS_FD")

    def report(step: float, value: float) -> None:
        if fd:
            with contextlib.suppress(OSError, ValueError):  # only ever an early stop lost
                os.write(int(fd), f"{step:.3f} {value:.6g}\n".encode())

    return report


def main() -> None:
    check_compile_caches()  # before anything imports torch._dynamo
    if os.environ.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    gpu = torch.cuda.is_available()
    device = torch.device("cuda" if gpu else "cpu")
    if gpu:
        budget, lr = GPU_TIME_BUDGET, GPU_LEARNING_RATE
        n_embd, n_layer, n_head = GPU_N_EMBD, GPU_N_LAYER, GPU_N_HEAD
        block_size, batch_size = GPU_BLOCK_SIZE, GPU_BATCH_SIZE
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    else:
        budget, lr = TIME_BUDGET, LEARNING_RATE
        n_embd, n_layer, n_head = N_EMBD, N_LAYER, N_HEAD
        block_size, batch_size = BLOCK_SIZE, BATCH_SIZE
    time_budget = float(os.environ.get("TINYGPT_TIME_BUDGET", budget))
    torch.manual_seed(SEED)
    gen = torch.Generator(device=device)
    gen.manual_seed(SEED)

    data_dir = Path(os.environ.get("RATCHET_DATA") or "data")
    train_path = data_dir / "train.bin"
    if not train_path.is_file():
        raise SystemExit(f"train.py: {train_path} not found; run `python prepare.py` first")
    train_data = torch.from_numpy(np.fromfile(train_path, dtype=np.uint8)).to(device)

    config = dict(
        vocab_size=256, block_size=block_size, n_layer=n_layer, n_head=n_head, n_embd=n_embd
    )
    model = GPT(**config).to(device)
    init_weights(model, n_layer)
    n_params = sum(p.numel() for p in model.parameters())
    # Weight decay on matrices and embeddings only, not on biases or layer-norm gains.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [
            {"params": decay, "weight_decay": WEIGHT_DECAY},
            {"params": no_decay, "weight_decay": 0.0},
        ],
        lr=lr,
        betas=(0.9, 0.95),
        fused=gpu,
    )
    step_model = torch.compile(model) if gpu and GPU_COMPILE else model
    # bf16 autocast on the GPU; on the CPU a no-op context, so the CPU path stays fp32.
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=gpu)
    print(f"device: {device}  params: {n_params:,}  config: {config}")
    print(f"lr: {lr}  batch: {batch_size}  budget: {time_budget:g}s  threads: {torch.get_num_threads()}")

    model.train()
    report = progress_reporter()
    step, timed, timed_steps, smooth_loss = 0, 0.0, 0, None
    t_start = time.perf_counter()
    while step < UNTIMED_STEPS or timed < time_budget:
        t0 = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / WARMUP_STEPS)
        x, y = get_batch(train_data, block_size, batch_size, gen)
        with autocast:
            logits = step_model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)).float(), y.reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        value = loss.item()  # waits for the GPU: the step's time is its real time
        if not math.isfinite(value):
            raise SystemExit(f"train.py: loss is {value} at step {step}")
        if step >= UNTIMED_STEPS:
            timed += time.perf_counter() - t0
            timed_steps += 1
        smooth_loss = value if smooth_loss is None else 0.9 * smooth_loss + 0.1 * value
        if step % LOG_EVERY == 0:
            print(f"step {step:5d} | loss {value:.4f} | {timed:6.1f}s timed", flush=True)
        if timed > 0 and step % PROGRESS_EVERY == 0:
            report(timed, smooth_loss)
        step += 1
    wall = time.perf_counter() - t_start

    tokens_per_sec = timed_steps * batch_size * block_size / max(timed, 1e-9)
    summary = {
        "device": torch.cuda.get_device_name(device) if gpu else "cpu",
        "steps": step,
        "train_seconds": round(timed, 3),
        "wall_seconds": round(wall, 3),
        "tokens_per_sec": round(tokens_per_sec, 1),
        "num_params": n_params,
        "config": config,
    }
    if gpu:
        summary["peak_memory_gb"] = round(torch.cuda.max_memory_allocated(device) / 1024**3, 3)
        summary["mfu_percent"] = round(
            100 * 6 * n_params * tokens_per_sec / peak_bf16_flops(device), 2
        )
    export_program(model, block_size, "model.pt2", summary)
    print("---")
    print(f"final_loss_bpb: {smooth_loss / math.log(2):.4f}")
    for key, value in summary.items():
        if key != "config":
            print(f"{key}: {value}")
    print("saved: model.pt2")


if __name__ == "__main__":
    main()
