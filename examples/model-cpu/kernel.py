"""The candidate kernel (editable): the model's tanh-GELU, one implementation per knob.

The model (model.py) computes it from eight elementwise torch ops, as GPT-2's NewGELU
does; `IMPL` picks how this kernel computes the same function. The tune proposer walks
the knob; an LLM or agent proposer may rewrite the function outright.
"""

import math

import torch

IMPL = "composed"  # composed | fused | inplace

_C = math.sqrt(2.0 / math.pi)


def gelu(x: torch.Tensor) -> torch.Tensor:
    if IMPL == "fused":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if IMPL == "inplace":
        inner = torch.pow(x, 3.0).mul_(0.044715).add_(x).mul_(_C).tanh_().add_(1.0)
        return inner.mul_(x).mul_(0.5)
    return 0.5 * x * (1.0 + torch.tanh(_C * (x + 0.044715 * torch.pow(x, 3.0))))
