"""A gated activation of one row left for the layer that reads it, which may have its kernel round the row to int8."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from wick.kernels.int8_activations import Int8Rows


class PendingAct:
    """act(gate) * up of one row (a batch-1 step's merged gate/up projection, `x` [1, 2F]) left for the layer that
    reads it: an int8 GEMV takes `int8_rows()`, the activation kernel's row rounded by that kernel, so no rounding
    kernel runs; else `value()` runs the activation (act_fn, a wick.layers.activation module)."""

    def __init__(self, x: torch.Tensor, act_fn: nn.Module) -> None:
        self.x = x
        self.act_fn = act_fn
        self._value: torch.Tensor | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    @property
    def columns(self) -> int:
        return self.x.shape[-1] // 2

    def int8_rows(self, interleave: bool = False) -> Int8Rows:
        """The activated row rounded to int8 (kernels/int8_activations.quantize_q8(value(), interleave)'s) by the
        activation kernel."""
        from wick.kernels.activation import act_and_mul_q8

        return act_and_mul_q8(self.x, self.act_fn.kernel_name, interleave)

    def value(self) -> torch.Tensor:
        """The activated row."""
        if self._value is None:
            self._value = self.act_fn(self.x)
        return self._value
