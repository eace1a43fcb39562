"""Weights in the model's dtype: one [output, input] matrix."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from wick.layers.pending_norm import PendingNorm
from wick.layers.quantization.base import LinearMethod, set_weight_attrs

if TYPE_CHECKING:
    from wick.kernels.rms_norm import RowNorm


def runs_dense_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether x @ W^T runs the Triton GEMV: one row of x in half precision on a GPU, where it reads W faster than
    cuBLAS (wick/kernels/dense_gemv.py)."""
    return (x.is_cuda and x.numel() == weight.shape[1] and x.dtype == weight.dtype
            and x.dtype in (torch.bfloat16, torch.float16) and weight.stride(1) == 1)


def _gemv_input(x: torch.Tensor | PendingNorm, weight: torch.Tensor) -> tuple[torch.Tensor, RowNorm | None]:
    """(the row x @ W^T reads, and the norm the GEMV applies to it first): a pending norm's own where the GEMV takes
    it (dense_gemv.takes_norm), else none."""
    if not isinstance(x, PendingNorm):
        return x, None
    if isinstance(x.x, torch.Tensor) and runs_dense_gemv(x.x, weight):
        from wick.kernels.dense_gemv import takes_norm

        norm = x.take() if takes_norm(*weight.shape) else None
        if norm is not None:
            return x.x, norm
    return x.value(), None


def dense_linear(x: torch.Tensor | PendingNorm, weight: torch.Tensor, bias: torch.Tensor | None = None
                 ) -> torch.Tensor:
    """F.linear, or the Triton GEMV where it runs."""
    x, norm = _gemv_input(x, weight)
    if runs_dense_gemv(x, weight):
        from wick.kernels.dense_gemv import dense_gemv

        return dense_gemv(x, weight, bias, norm=norm)
    return F.linear(x, weight, bias)


class UnquantizedLinearMethod(LinearMethod):
    reads_pending_norm = True

    def create_weights(self, layer: nn.Module, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(sum(output_sizes), input_size, dtype=params_dtype), requires_grad=False)
        layer.register_parameter("weight", set_weight_attrs(weight, output_dim=0, input_dim=1))

    def apply(self, layer: nn.Module, x: torch.Tensor | PendingNorm, bias: torch.Tensor | None) -> torch.Tensor:
        return dense_linear(x, layer.weight, bias)

    def apply_gated(self, layer: nn.Module, x: torch.Tensor | PendingNorm, bias: torch.Tensor | None,
                    activation: str) -> torch.Tensor | None:
        x, norm = _gemv_input(x, layer.weight)
        if not runs_dense_gemv(x, layer.weight):
            return None
        from wick.kernels.dense_gemv import dense_gemv

        return dense_gemv(x, layer.weight, bias, activation=activation, norm=norm)
