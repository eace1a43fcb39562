"""A split attention's output row left uncombined for the layer that reads it, which may have the combine round the
row to int8."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from wick.kernels.int8_activations import Int8Rows
    from wick.kernels.split_combine import SplitPartials


class PendingCombine:
    """A decode step's attention output (one row of heads, [1, H * D]) whose splits are still to be merged, left for
    the output projection: an int8 GEMV takes `int8_rows()`, the row rounded by the combine kernel itself, so no
    rounding kernel runs; else `value()` runs the combine."""

    def __init__(self, partials: SplitPartials) -> None:
        self.partials = partials
        self._value: torch.Tensor | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.partials.out.dtype

    @property
    def columns(self) -> int:
        return self.partials.out.shape[1] * self.partials.out.shape[2]

    def int8_rows(self, interleave: bool = False) -> Int8Rows:
        """The row rounded to int8 (kernels/int8_activations.quantize_q8(value(), interleave)'s) by the combine."""
        from wick.kernels.split_combine import combine_splits

        return combine_splits(self.partials, int8_rows=True, interleave=interleave)

    def value(self) -> torch.Tensor:
        """The combined row, [1, H * D]."""
        if self._value is None:
            from wick.kernels.split_combine import combine_splits

            self._value = combine_splits(self.partials).view(-1, self.columns)
        return self._value
