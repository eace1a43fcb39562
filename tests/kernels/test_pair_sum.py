"""An MoE layer's weighted sum over each token's pairs: sum_pairs against torch, and the RMSNorm kernels that sum the
pairs as they load them (pair_sum.PairRows) against sum_pairs then the same kernels, bit for bit."""

from __future__ import annotations

import pytest
import torch

from wick.kernels.pair_sum import PairRows, sum_pairs
from wick.kernels.rms_norm import RowNorm, fused_add_rms_norm, row_norm, row_norm_q8

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def pairs(tokens: int, top_k: int, hidden: int, dtype: torch.dtype, seed: int) -> PairRows:
    g = torch.Generator().manual_seed(seed)
    rows = torch.randn(tokens * top_k, hidden, generator=g).to(DEVICE, dtype)
    return PairRows(rows, torch.rand(tokens, top_k, generator=g).to(DEVICE))


@pytest.mark.parametrize("weighted", [False, True], ids=["plain", "weighted"])
def test_sum_pairs(weighted: bool) -> None:
    g = torch.Generator().manual_seed(4)
    partial = torch.randn(5 * 3, 40, generator=g).to(DEVICE)
    weights = torch.rand(5, 3, generator=g).to(DEVICE)
    expected = (partial.view(5, 3, 40) * (weights.unsqueeze(-1) if weighted else 1)).sum(1)
    torch.testing.assert_close(sum_pairs(partial, 3, weights if weighted else None), expected)


def test_pair_rows_value_adds_the_rounded_products_in_order() -> None:
    """Each pair's row times its weight rounded to float32, added to the sum in order, the sum rounded once."""
    rows = pairs(3, 8, 64, torch.float16, 5)
    assert rows.shape == (3, 64) and rows.dtype == torch.float16
    expected = torch.zeros(3, 64, device=DEVICE)
    for j in range(8):
        expected += rows.rows.view(3, 8, 64)[:, j].float() * rows.weights[:, j:j + 1]
    assert torch.equal(rows.value(), expected.half())


@pytest.mark.parametrize(("tokens", "top_k", "hidden"), [(1, 8, 256), (3, 3, 96), (5, 2, 2048)])
def test_the_norm_sums_the_pairs_as_sum_pairs_does(tokens: int, top_k: int, hidden: int) -> None:
    """residual + the pairs' sum and its RMSNorm, from the pairs, equal those from sum_pairs' rows (several rows a
    program where they are short, one where long)."""
    x = pairs(tokens, top_k, hidden, torch.float16, 6)
    g = torch.Generator().manual_seed(7)
    residual = torch.randn(tokens, hidden, generator=g).to(DEVICE, torch.float16)
    weight = (torch.rand(hidden, generator=g) + 0.5).to(DEVICE, torch.float16)
    normed, added = fused_add_rms_norm(x, residual.clone(), weight, 1e-6)
    expected, expected_added = fused_add_rms_norm(x.value(), residual.clone(), weight, 1e-6)
    assert torch.equal(added, expected_added) and torch.equal(normed, expected)


@pytest.mark.parametrize("interleave", [False, True], ids=["in_order", "interleaved"])
def test_a_pending_norm_of_pairs_rounds_the_same_row(interleave: bool) -> None:
    """One token's pairs through the kernels of a pending norm: the residual, the normed row and its int8 codes are
    those of its summed row."""
    x = pairs(1, 8, 256, torch.float16, 8)
    g = torch.Generator().manual_seed(9)
    residual = torch.randn(1, 256, generator=g).to(DEVICE, torch.float16)
    weight = (torch.rand(256, generator=g) + 0.5).to(DEVICE, torch.float16)
    ours, theirs, plain = (RowNorm(weight, 1e-6, residual, torch.empty_like(residual), torch.empty_like(residual))
                           for _ in range(3))
    rows = row_norm_q8(x, ours, interleave)
    expected_rows = row_norm_q8(x.value(), theirs, interleave)
    assert torch.equal(ours.residual_out, theirs.residual_out) and torch.equal(ours.normed_out, theirs.normed_out)
    for got, expected in zip(rows, expected_rows, strict=True):
        assert torch.equal(got, expected)
    assert torch.equal(row_norm(x, plain), theirs.normed_out)


def test_pairs_must_be_contiguous_rows_of_their_weights() -> None:
    x = pairs(2, 4, 64, torch.float16, 10)
    residual = torch.zeros(2, 64, device=DEVICE, dtype=torch.float16)
    weight = torch.ones(64, device=DEVICE, dtype=torch.float16)
    with pytest.raises(ValueError, match="contiguous"):
        fused_add_rms_norm(PairRows(x.rows, x.weights.t().contiguous().t()), residual, weight, 1e-6)
    with pytest.raises(ValueError, match="contiguous"):
        fused_add_rms_norm(PairRows(x.rows[:6], x.weights), residual, weight, 1e-6)
