"""Gated activation for merged gate/up projections."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SiluAndMul(nn.Module):
    """[..., 2d] (gate, up side by side) -> silu(gate) * up, [..., d]."""

    kernel_name = "silu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
            from wick.kernels.activation import silu_and_mul

            return silu_and_mul(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


class GeluAndMul(nn.Module):
    """[..., 2d] (gate, up side by side) -> gelu(gate) * up, [..., d]; tanh-approximated GELU or exact."""

    def __init__(self, approximate: str = "tanh") -> None:
        super().__init__()
        self.approximate = approximate
        self.kernel_name = "gelu_tanh" if approximate == "tanh" else "gelu"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.is_cuda:
            # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
            from wick.kernels.activation import gelu_and_mul

            return gelu_and_mul(x, self.approximate)
        gate, up = x.chunk(2, dim=-1)
        return F.gelu(gate, approximate=self.approximate) * up


_GATED = {
    "silu": SiluAndMul,
    "swish": SiluAndMul,
    "gelu_pytorch_tanh": lambda: GeluAndMul("tanh"),
    "gelu_new": lambda: GeluAndMul("tanh"),
    "gelu_fast": lambda: GeluAndMul("tanh"),
    "gelu": lambda: GeluAndMul("none"),
}


def get_act_and_mul(name: str) -> nn.Module:
    """The gated activation of an HF `hidden_act` name."""
    if name not in _GATED:
        raise ValueError(f"unsupported activation {name!r}; supported: {', '.join(_GATED)}")
    return _GATED[name]()
