"""Merging a split attention's partials left uncombined (paged_attention's defer_combine): into the output that
paged_attention gives when it merges them itself, or a decode step's rows rounded to int8 as quantize_q8 rounds the
merged rows."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_paged_attention import MIXED, make_batch
from wick.kernels.int8_activations import quantize_q8
from wick.kernels.paged_attention import paged_attention
from wick.kernels.split_combine import SplitPartials, combine_splits


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
def test_combine_rounds_a_decode_row_for_an_int8_gemv(head_dim: int, interleave: bool) -> None:
    """A split decode step left uncombined: the combine rounding each token's row of heads to int8 gives the codes,
    scales and sums that quantize_q8 gives from the combined rows, and leaves out unwritten."""
    seq_lens = [40, 17, 33]
    batch = make_batch(seq_lens, [1] * 3, 4, 2, head_dim, 4, torch.bfloat16)
    args = (*batch, head_dim**-0.5, 1, max(seq_lens))
    expected = paged_attention(*args, num_splits=3)
    partials = paged_attention(*args, num_splits=3, defer_combine=True)
    assert isinstance(partials, SplitPartials)
    partials.out.fill_(7.0)
    rows = combine_splits(partials, int8_rows=True, interleave=interleave)
    assert torch.equal(partials.out, torch.full_like(partials.out, 7.0))
    for got, want in zip(rows, quantize_q8(expected.view(3, -1), interleave), strict=True):
        assert torch.equal(got, want)
    assert torch.equal(combine_splits(partials), expected)


def test_only_a_decode_step_is_rounded_as_combined() -> None:
    batch = make_batch(*MIXED, 4, 2, 32, 4, torch.float32)
    partials = paged_attention(*batch, 32**-0.5, max(MIXED[1]), max(MIXED[0]), num_splits=2, defer_combine=True)
    with pytest.raises(ValueError, match="decode step"):
        combine_splits(partials, int8_rows=True)
