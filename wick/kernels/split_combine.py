"""Merging a split attention's partial results (paged_attention.py, split-KV): each split of a query head's keys left
its unnormalised sums with their running maximum and sum, and one program a (token, head) weighs them by their
maxima into the head's output. At a decode step the merge may round each token's row of heads to int8 instead, as
the int8 GEMV of the output projection after it takes its x (PendingCombine)."""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from wick.kernels.int8_activations import Int8Rows, int8_rows_like, store_runs
from wick.kernels.pdl import pdl_options, pdl_prologue


@triton.jit(do_not_specialize=["num_reqs", "num_splits"])
def _combine_splits_kernel(
    out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, part_used_ptr, query_start_loc_ptr, num_reqs, num_splits,
    stride_ot, stride_oh, q_ptr, d_ptr, s_ptr,
    HEAD_DIM: tl.constexpr, SPLITS_PAD: tl.constexpr, DECODE: tl.constexpr, QUANTIZE: tl.constexpr,
    INTERLEAVE: tl.constexpr, PDL: tl.constexpr,
):
    """Where QUANTIZE (a decode step) each token's row of heads is rounded to int8 instead of stored, as
    int8_activations.quantize_q8 rounds it (store_runs; HEAD_DIM a multiple of 32)."""
    pdl_prologue(PDL)
    token = tl.program_id(0)
    head = tl.program_id(1)
    if not DECODE:  # a decode step's rows are all requests'
        if token >= tl.load(query_start_loc_ptr + num_reqs):
            return
    splits = tl.arange(0, SPLITS_PAD)
    dims = tl.arange(0, HEAD_DIM)
    row = token.to(tl.int64) * tl.num_programs(1) + head
    valid = splits < tl.load(part_used_ptr + row)
    part = row * num_splits + splits
    m = tl.load(part_m_ptr + part, mask=valid, other=float("-inf"))
    l_part = tl.load(part_l_ptr + part, mask=valid, other=0.0)
    acc = tl.load(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], mask=valid[:, None], other=0.0)
    weight = tl.exp2(m - tl.max(m, 0))
    total = tl.sum(weight * l_part, 0)
    out = (tl.sum(acc * weight[:, None], 0) / tl.where(total > 0, total, 1.0)).to(out_ptr.dtype.element_ty)
    if QUANTIZE:
        width = tl.num_programs(1) * HEAD_DIM
        runs = head * (HEAD_DIM // 32) + tl.arange(0, HEAD_DIM // 32)
        store_runs(tl.reshape(out.to(tl.float32), [HEAD_DIM // 32, 32]), q_ptr + token.to(tl.int64) * width,
                   d_ptr + token.to(tl.int64) * (width // 32), s_ptr + token.to(tl.int64) * (width // 32), runs, width,
                   INTERLEAVE)
    else:
        tl.store(out_ptr + token * stride_ot + head * stride_oh + dims, out)


class SplitPartials(NamedTuple):
    """A split attention's partial results, to merge into `out` (combine_splits)."""

    out: torch.Tensor
    acc: torch.Tensor  # each split's unnormalised sums, [T, H, splits, D]
    maxes: torch.Tensor  # their running maxima and sums, [T, H, splits]
    sums: torch.Tensor
    used: torch.Tensor  # the splits that had keys, [T, H]
    query_start_loc: torch.Tensor
    num_reqs: int
    decode: bool


def combine_splits(partials: SplitPartials, int8_rows: bool = False, interleave: bool = False
                   ) -> torch.Tensor | Int8Rows:
    """The splits merged into partials.out, which is returned; with int8_rows (a decode step, the heads a multiple of
    32 wide) each token's row of heads rounded to int8 instead, as int8_activations.quantize_q8(out rows,
    interleave) would round it, returned as Int8Rows, and out not written. The int8 GEMV after this kernel is then
    released only after its wait (pdl.py)."""
    out = partials.out
    num_tokens, num_heads, head_dim = out.shape
    num_splits = partials.acc.shape[2]
    quantized = None
    if int8_rows:
        if not partials.decode or head_dim % 32:
            raise ValueError("only a decode step's heads, a multiple of 32 wide, are rounded as they are combined")
        quantized = int8_rows_like(out.view(num_tokens, num_heads * head_dim))
    _combine_splits_kernel[(num_tokens, num_heads)](
        out, partials.acc, partials.maxes, partials.sums, partials.used, partials.query_start_loc, partials.num_reqs,
        num_splits, out.stride(0), out.stride(1), *(quantized or (out, out, out)),
        HEAD_DIM=head_dim, SPLITS_PAD=triton.next_power_of_2(num_splits), DECODE=partials.decode,
        QUANTIZE=quantized is not None, INTERLEAVE=interleave,
        **pdl_options(out, before_int8_gemv=quantized is not None),
    )
    return out if quantized is None else quantized
