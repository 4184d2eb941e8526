"""A tiny transformer language-model block stack (protected: the model the study serves).

Written the way many real models are: RMSNorm and the tanh-GELU are composed of
elementwise torch ops (as in Hugging Face's Llama RMSNorm and GPT-2's NewGELU), softmax
is the library's. Each of the three is looked up in `OPS` on every call, so ratchet can
swap one for a kernel (`ratchet.kernels.endtoend`) and label them for the profiler
(`ratchet profile`), without the model knowing about either.

The protocol ratchet uses (docs/kernels.md, "From the model to the kernel and back"):
- `OPS`: name -> callable, looked up per call;
- `build_model(dtype, device)`: the model with fixed (seeded) weights;
- `make_inputs(point, dtype, rng)`: the inputs of one workload point (a prefill takes
  hidden states; a decode step one token per sequence and a KV cache of `context`).
"""

from __future__ import annotations

import math
import os

import numpy as np
import torch

# Small by default; bench/gpu_model_check.sh sets GPT-2-small sizes (768, 12, 12, 50257).
DIM, HEADS, LAYERS, VOCAB = (int(os.environ.get(f"MODEL_CPU_{k}", v)) for k, v in
                             (("DIM", 64), ("HEADS", 4), ("LAYERS", 2), ("VOCAB", 512)))
HEAD = DIM // HEADS


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    variance = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(variance + eps) * weight


def gelu(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


OPS = {"rms_norm": rms_norm, "gelu": gelu, "softmax": softmax}


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = torch.nn.Parameter(torch.ones(DIM))
        self.norm2 = torch.nn.Parameter(torch.ones(DIM))
        self.qkv = torch.nn.Linear(DIM, 3 * DIM)
        self.proj = torch.nn.Linear(DIM, DIM)
        self.up = torch.nn.Linear(DIM, 4 * DIM)
        self.down = torch.nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor, past_k: torch.Tensor | None, past_v: torch.Tensor | None) -> torch.Tensor:
        b, s, _ = x.shape
        h = OPS["rms_norm"](x, self.norm1)
        q, k, v = self.qkv(h).view(b, s, 3, HEADS, HEAD).permute(2, 0, 3, 1, 4)
        if past_k is not None:
            k = torch.cat([past_k, k], dim=2)
            v = torch.cat([past_v, v], dim=2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(HEAD)
        if s > 1:  # prefill: causal
            mask = torch.ones(s, k.shape[2], dtype=torch.bool, device=x.device).triu(k.shape[2] - s + 1)
            scores = scores.masked_fill(mask, float("-inf"))
        att = OPS["softmax"](scores) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, DIM))
        return x + self.down(OPS["gelu"](self.up(OPS["rms_norm"](x, self.norm2))))


class TinyLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.Parameter(torch.ones(DIM))
        self.head = torch.nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, x: torch.Tensor, past_k: torch.Tensor | None = None, past_v: torch.Tensor | None = None) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            x = block(x, None if past_k is None else past_k[i], None if past_v is None else past_v[i])
        return self.head(OPS["rms_norm"](x, self.norm))


def build_model(dtype: str = "float32", device: str = "cpu") -> torch.nn.Module:
    torch.manual_seed(0)
    model = TinyLM()
    with torch.no_grad():  # weights large enough that every op matters to the logits
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 2.4 / math.sqrt(p.shape[1]))
    return model.to(device=device, dtype=getattr(torch, dtype)).eval()


def make_inputs(point: dict, dtype: str, rng: np.random.Generator) -> tuple[torch.Tensor, ...]:
    tdtype = getattr(torch, dtype)
    b, s = int(point["batch"]), int(point.get("seq", 1))
    x = torch.from_numpy(rng.standard_normal((b, s, DIM), dtype=np.float32)).to(tdtype)
    context = int(point.get("context", 0))
    if not context:
        return (x,)
    cache = (LAYERS, b, HEADS, context, HEAD)
    k = torch.from_numpy(rng.standard_normal(cache, dtype=np.float32)).to(tdtype)
    v = torch.from_numpy(rng.standard_normal(cache, dtype=np.float32)).to(tdtype)
    return (x, k, v)
