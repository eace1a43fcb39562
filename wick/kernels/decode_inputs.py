"""The first kernel of a step graph: the inputs that come from the device rather than the host copy. Each row of a
decode graph takes its token from the previous step's samples where it has one there, and the step's block table
(packed at the width of its longest context) goes into the graph's own table (as wide as the longest possible
context); a prefill graph's one row takes no token here (its pending one is gathered before the replay). A decode
graph's rows are also ranked here, longest context first: the order in which its attention takes them."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 256


@triton.jit
def _decode_inputs_kernel(ids_ptr, previous_rows_ptr, samples_ptr, table_shape_ptr, packed_ptr, table_ptr,
                          seq_lens_ptr, order_ptr, stride_table, BLOCK: tl.constexpr, ORDER: tl.constexpr):
    row = tl.program_id(0)
    if ORDER:  # the row's rank: the rows of longer contexts, and those of as long ones before it
        own = tl.load(seq_lens_ptr + row)
        rank = tl.zeros([], dtype=tl.int32)
        for start in range(0, tl.num_programs(0), BLOCK):
            others = start + tl.arange(0, BLOCK)
            lens = tl.load(seq_lens_ptr + others, mask=others < tl.num_programs(0), other=-1)
            rank += tl.sum(((lens > own) | ((lens == own) & (others < row))).to(tl.int32), 0)
        tl.store(order_ptr + rank, row)
    source = tl.load(previous_rows_ptr + row)
    if source >= 0:
        tl.store(ids_ptr + row, tl.load(samples_ptr + source))
    num_rows = tl.load(table_shape_ptr)
    width = tl.load(table_shape_ptr + 1)
    if row < num_rows:
        for start in range(0, width, BLOCK):
            cols = start + tl.arange(0, BLOCK)
            keep = cols < width
            blocks = tl.load(packed_ptr + row * width + cols, mask=keep)
            tl.store(table_ptr + row * stride_table + cols, blocks, mask=keep)


def decode_inputs(input_ids: torch.Tensor, previous_rows: torch.Tensor, samples: torch.Tensor,
                  table_shape: torch.Tensor, packed_table: torch.Tensor, block_table: torch.Tensor,
                  seq_lens: torch.Tensor | None = None, order: torch.Tensor | None = None) -> None:
    """In place, without a host sync: input_ids[i] = samples[previous_rows[i]] where previous_rows[i] >= 0, and
    block_table[:n, :w] = packed_table[:n * w].view(n, w) with (n, w) = table_shape (int32 on the device). With
    seq_lens and order (int32 [rows]): order = the rows by seq_lens, longest first, ties in row order.

    input_ids, previous_rows, samples int64 [>= rows]; packed_table int32, flat; block_table int32 [>= n, >= w],
    rows contiguous."""
    assert block_table.stride(1) == 1
    if (seq_lens is None) != (order is None):
        raise ValueError("seq_lens and order come together")
    rank = order is not None
    _decode_inputs_kernel[(input_ids.numel(),)](input_ids, previous_rows, samples, table_shape, packed_table,
                                                block_table, seq_lens if rank else table_shape,
                                                order if rank else table_shape, block_table.stride(0), BLOCK=_BLOCK,
                                                ORDER=rank, num_warps=1)


def decode_inputs_torch(input_ids: torch.Tensor, previous_rows: torch.Tensor, samples: torch.Tensor,
                        table_shape: torch.Tensor, packed_table: torch.Tensor, block_table: torch.Tensor,
                        seq_lens: torch.Tensor | None = None, order: torch.Tensor | None = None) -> None:
    """decode_inputs in torch ops (with a host sync): its reference."""
    taken = previous_rows >= 0
    input_ids[taken] = samples[previous_rows[taken]]
    n, w = table_shape.tolist()
    block_table[:n, :w] = packed_table[:n * w].view(n, w)
    if order is not None:
        order.copy_(torch.sort(seq_lens[:input_ids.numel()], descending=True, stable=True).indices)
