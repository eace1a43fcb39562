"""The first kernel of a step graph: the inputs that come from the device rather than the host copy. Each row of a
decode graph takes its token from the previous step's samples where it has one there, and the step's block table
(packed at the width of its longest context) goes into the graph's own table (as wide as the longest possible
context); a prefill graph's one row takes no token here (its pending one is gathered before the replay)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

_BLOCK = 256


@triton.jit
def _decode_inputs_kernel(ids_ptr, previous_rows_ptr, samples_ptr, table_shape_ptr, packed_ptr, table_ptr,
                          stride_table, BLOCK: tl.constexpr):
    row = tl.program_id(0)
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
                  table_shape: torch.Tensor, packed_table: torch.Tensor, block_table: torch.Tensor) -> None:
    """In place, without a host sync: input_ids[i] = samples[previous_rows[i]] where previous_rows[i] >= 0, and
    block_table[:n, :w] = packed_table[:n * w].view(n, w) with (n, w) = table_shape (int32 on the device).

    input_ids, previous_rows, samples int64 [>= rows]; packed_table int32, flat; block_table int32 [>= n, >= w],
    rows contiguous."""
    assert block_table.stride(1) == 1
    _decode_inputs_kernel[(input_ids.numel(),)](input_ids, previous_rows, samples, table_shape, packed_table,
                                                block_table, block_table.stride(0), BLOCK=_BLOCK, num_warps=1)


def decode_inputs_torch(input_ids: torch.Tensor, previous_rows: torch.Tensor, samples: torch.Tensor,
                        table_shape: torch.Tensor, packed_table: torch.Tensor, block_table: torch.Tensor) -> None:
    """decode_inputs in torch ops (with a host sync): its reference."""
    taken = previous_rows >= 0
    input_ids[taken] = samples[previous_rows[taken]]
    n, w = table_shape.tolist()
    block_table[:n, :w] = packed_table[:n * w].view(n, w)
