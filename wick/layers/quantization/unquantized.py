"""Weights in the model's dtype: one [output, input] matrix."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wick.layers.quantization.base import LinearMethod, set_weight_attrs


class UnquantizedLinearMethod(LinearMethod):
    def create_weights(self, layer: nn.Module, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=params_dtype), requires_grad=False)
        layer.register_parameter("weight", set_weight_attrs(weight, output_dim=0, input_dim=1))

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, layer.weight, bias)
