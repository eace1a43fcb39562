"""A linear layer every tensor-parallel rank holds whole (small projections such as MLA's down-projections)."""

from __future__ import annotations

import torch
from torch import nn

from wick.layers.linear import default_weight_loader
from wick.layers.quantization.unquantized import dense_linear


class ReplicatedLinear(nn.Module):
    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size), requires_grad=False)
            self.bias.weight_loader = default_weight_loader
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense_linear(x, self.weight, self.bias)
