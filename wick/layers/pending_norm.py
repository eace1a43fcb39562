"""An RMSNorm of one row left for the layer that reads it, which may apply it inside its own kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from wick.layers.pending_act import PendingAct
from wick.layers.pending_combine import PendingCombine

if TYPE_CHECKING:
    from wick.kernels.int8_activations import Int8Rows
    from wick.kernels.pair_sum import PairRows
    from wick.kernels.rms_norm import RowNorm


class PendingNorm:
    """RMSNorm(x + residual) of one row (a batch-1 step's) left for the layer that reads it: a kernel of that
    layer that can apply it on its way (kernels/rms_norm.RowNorm: the float GEMV where K is small) takes it, and
    no norm kernel runs; an int8 GEMV takes `int8_rows()`, the norm kernel's row rounded by that kernel; else
    `value()` runs one. `residual`, x + residual out of place, is written by whichever runs first. x may be an MoE
    layer's pairs unsummed (PairRows), which only the norm kernel sums: no GEMV takes the norm of those."""

    def __init__(self, x: torch.Tensor | PairRows, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
        self.x = x
        self.residual = torch.empty_like(residual)
        self._norm = (weight, eps, residual)
        self._normed: torch.Tensor | None = None

    def take(self) -> RowNorm | None:
        """The norm, for a kernel about to apply it to x that must then run; None once one has (value() has it)."""
        if self._normed is not None:
            return None
        from wick.kernels.rms_norm import RowNorm

        weight, eps, residual = self._norm
        self._normed = torch.empty_like(residual)
        return RowNorm(weight, eps, residual, self.residual, self._normed)

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    @property
    def columns(self) -> int:
        return self.x.shape[-1]

    def int8_rows(self, interleave: bool = False) -> Int8Rows:
        """The normed row rounded to int8 for an int8 GEMV (kernels/int8_activations.quantize_q8(row, interleave)'s):
        by the norm kernel as it norms where no kernel has normed the row yet, so no rounding kernel runs; else
        from the row."""
        norm = self.take()
        if norm is None:
            from wick.kernels.int8_activations import quantize_q8

            return quantize_q8(self._normed, interleave)
        from wick.kernels.rms_norm import row_norm_q8

        return row_norm_q8(self.x, norm, interleave)

    def value(self) -> torch.Tensor:
        """The normed row."""
        norm = self.take()
        if norm is not None:
            from wick.kernels.rms_norm import row_norm

            row_norm(self.x, norm)
        return self._normed


# A row a layer's reader may take pending (each has dtype, columns, int8_rows(interleave) and value()).
PendingRow = PendingNorm | PendingAct | PendingCombine


def resolved(x: torch.Tensor | PendingRow) -> torch.Tensor:
    """x, or a pending row's value."""
    return x.value() if isinstance(x, PendingRow) else x
