"""The weighted sum that ends an MoE layer: row t * top_k + j of the experts' products is token t's j-th (token,
expert) pair's, and token t's output is their sum, each times its routing weight, in float32 over j = 0, 1, ... in
order, rounded once. A kernel of its own (sum_pairs), or, for a layer's output left unsummed (PairRows), the RMSNorm
that adds it to the residual (rms_norm.py), which sums the rows as it loads them, the same way, so that no kernel runs
for the sum."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl


class PairRows(NamedTuple):
    """An MoE layer's output left unsummed: rows [T * top_k, N] (contiguous; row t * top_k + j token t's j-th pair's)
    and their routing weights [T, top_k] (float32, contiguous)."""

    rows: torch.Tensor
    weights: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        """The summed output's, [T, N]."""
        return torch.Size((self.weights.shape[0], self.rows.shape[1]))

    @property
    def dtype(self) -> torch.dtype:
        return self.rows.dtype

    @property
    def device(self) -> torch.device:
        return self.rows.device

    @property
    def is_cuda(self) -> bool:
        return self.rows.is_cuda

    def value(self) -> torch.Tensor:
        """The summed output [T, N] in the rows' dtype (sum_pairs)."""
        return sum_pairs(self.rows, self.weights.shape[1], self.weights)


@triton.jit
def pair_sum(rows_ptr, weights_ptr, tokens, token_mask, cols, col_mask, N, TOP_K: tl.constexpr,
             WEIGHTED: tl.constexpr):
    """For tokens [R] (token_mask [R]) and columns cols [C] (col_mask [C]): the sum over j of rows[t * TOP_K + j, cols],
    times weights[t * TOP_K + j] where WEIGHTED, in float32, j in order. Its kernels are compiled without fp
    contraction, so each product is rounded before it is added wherever it runs."""
    mask = token_mask[:, None] & col_mask[None, :]
    total = tl.zeros(mask.shape, dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        pair = tokens.to(tl.int64) * TOP_K + j
        row = tl.load(rows_ptr + pair[:, None] * N + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        if WEIGHTED:
            row *= tl.load(weights_ptr + pair, mask=token_mask, other=0.0)[:, None]
        total += row
    return total


@triton.jit
def _sum_pairs_kernel(partial_ptr, weights_ptr, out_ptr, N, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr,
                      WEIGHTED: tl.constexpr):
    token = tl.program_id(0) + tl.zeros([1], dtype=tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    total = pair_sum(partial_ptr, weights_ptr, token, token >= 0, cols, cols < N, N, TOP_K, WEIGHTED)
    tl.store(out_ptr + token[:, None] * N + cols[None, :], total.to(out_ptr.dtype.element_ty),
             mask=(cols < N)[None, :])


def sum_pairs(partial: torch.Tensor, top_k: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """partial [T * top_k, N] (contiguous; row t * top_k + j: token t's j-th expert) -> [T, N], the sum over j, each
    row times weights [T, top_k] (float32) if given."""
    hidden = partial.shape[1]
    summed = torch.empty(partial.shape[0] // top_k, hidden, dtype=partial.dtype, device=partial.device)
    block_n = min(1024, triton.next_power_of_2(hidden))
    _sum_pairs_kernel[(summed.shape[0], triton.cdiv(hidden, block_n))](
        partial, partial if weights is None else weights.contiguous(), summed, hidden, TOP_K=top_k, BLOCK_N=block_n,
        WEIGHTED=weights is not None, enable_fp_fusion=False,
    )
    return summed


def summed_unless(rows: torch.Tensor, weights: torch.Tensor, unsummed: bool) -> torch.Tensor | PairRows:
    """An MoE layer's pairs' rows [T * top_k, N] and routing weights [T, top_k]: as PairRows where `unsummed` (for the
    norm after the layer to sum), else summed by sum_pairs."""
    pairs = PairRows(rows, weights.float().contiguous())
    return pairs if unsummed else pairs.value()
