"""RMSNorm, optionally fused with the residual add that precedes it, or left to the layer that reads it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wick.distributed.communication import PartialSum
from wick.kernels.pair_sum import PairRows
from wick.layers.linear import default_weight_loader
from wick.layers.pending_norm import PendingNorm


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # torch's rms_norm: one call where x * rsqrt(mean(x^2) + eps) is five (a CPU decode step runs 60 norms).
        if x.dtype == torch.float32:
            return F.rms_norm(x, x.shape[-1:], self.weight, eps=self.eps)
        return self.weight * F.rms_norm(x.float(), x.shape[-1:], eps=self.eps).to(x.dtype)

    def forward(
        self, x: torch.Tensor | PairRows | PartialSum, residual: torch.Tensor | None = None,
        x_norm: RMSNorm | None = None, pending: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor | PendingNorm, torch.Tensor]:
        """Without residual: norm(x). With residual: (norm(x + residual), x + residual). x_norm (with a
        residual only): a norm applied to x first (Gemma's and GLM-4's norm of a sublayer's output). pending
        (with a residual, and its reader takes PendingNorm): the norm of one row on CUDA is left to the reader.

        On CUDA one fused kernel runs, and x + residual is written into residual in place (a pending norm's goes
        out of place, into PendingNorm.residual). x may be an MoE layer's pairs unsummed (PairRows), which that
        kernel sums as it loads them, or a row-parallel layer's output before its all-reduce (PartialSum), which
        one kernel sums over the ranks, adds and norms where it can (a residual and no x_norm), else is
        all-reduced first.
        """
        if isinstance(x, PartialSum):
            fused = x.add_rms_norm(residual, self.weight, self.eps) if residual is not None and x_norm is None else None
            if fused is not None:
                return fused
            x = x.value()
        if isinstance(x, PairRows) and residual is None:
            x = x.value()
        if pending and residual is not None and x_norm is None and self._pends(x, residual):
            norm = PendingNorm(x, residual, self.weight, self.eps)
            return norm, norm.residual
        if x.is_cuda:
            # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
            from wick.kernels.rms_norm import fused_add_rms_norm, rms_norm

            if residual is None:
                return rms_norm(x, self.weight, self.eps)
            if x_norm is not None and x_norm.weight.dtype == x.dtype:
                return fused_add_rms_norm(x, residual, self.weight, self.eps, (x_norm.weight, x_norm.eps))
            if x_norm is not None:
                x = x_norm(x)
            return fused_add_rms_norm(x, residual, self.weight, self.eps)
        if isinstance(x, PairRows):
            x = x.value()
        if residual is None:
            return self._norm(x)
        if x_norm is not None:
            x = x_norm(x)
        x = x + residual
        return self._norm(x), x

    def _pends(self, x: torch.Tensor | PairRows, residual: torch.Tensor) -> bool:
        return (x.is_cuda and len(x.shape) == 2 and x.shape[0] == 1 and x.dtype in (torch.bfloat16, torch.float16)
                and self.weight.dtype == x.dtype and residual.dtype == x.dtype
                and (isinstance(x, PairRows) or x.is_contiguous()) and residual.is_contiguous())


class GemmaRMSNorm(RMSNorm):
    """Gemma's RMSNorm scales by (1 + w): the checkpoint's w is stored plus one, so the forward (and its
    CUDA kernel) is RMSNorm's."""

    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__(hidden_size, eps)
        self.weight.weight_loader = self._load_plus_one

    @staticmethod
    def _load_plus_one(param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: None = None) -> None:
        default_weight_loader(param, loaded_weight.float() + 1.0)


class LayerNorm(nn.Module):
    """LayerNorm with a bias, with RMSNorm's optional residual: (norm(x + residual), x + residual)."""

    def __init__(self, hidden_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
        self.weight.weight_loader = default_weight_loader
        self.bias.weight_loader = default_weight_loader

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x.float(), x.shape[-1:], self.weight.float(), self.bias.float(), self.eps).to(x.dtype)

    def forward(
        self, x: torch.Tensor | PairRows | PartialSum, residual: torch.Tensor | None = None,
        x_norm: nn.Module | None = None, pending: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """pending: ignored (no kernel takes a LayerNorm on its way)."""
        if isinstance(x, PartialSum | PairRows):
            x = x.value()
        if residual is None:
            return self._norm(x)
        if x_norm is not None:
            x = x_norm(x)
        x = x + residual
        return self._norm(x), x
