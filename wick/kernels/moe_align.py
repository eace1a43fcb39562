"""The (token, expert) pairs sorted by expert into tiles of block_m rows for the fused MoE GEMMs, in three kernels.

The pairs are cut into chunks. The first kernel counts each chunk's pairs by expert and ranks every pair among its
chunk's pairs of the same expert; the second (one program) turns the counts into each chunk's offset within each
expert's run, the runs' starts (each padded to a multiple of block_m), the row count and each tile's expert; the third
writes every pair to its run's start + its chunk's offset + its rank. The order is the stable sort's, and nothing
waits for the host, so a CUDA graph can hold it. (The torch ops this replaces, an argsort with a scatter, cumsums and a
searchsorted, took 128 us for 16,384 pairs on an H200, a fifth of the layer.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The elements of a [pairs, experts] one-hot tile a program holds.
_TILE_ELEMENTS = 8192


@triton.jit(do_not_specialize=["num_pairs"])
def _count_chunks_kernel(ids_ptr, counts_ptr, rank_ptr, num_pairs, E: tl.constexpr, E_PAD: tl.constexpr,
                         CHUNK: tl.constexpr):
    """counts[c, e]: chunk c's pairs of expert e; rank[p]: the pairs of p's expert before p in its chunk."""
    chunk = tl.program_id(0)
    pairs = chunk * CHUNK + tl.arange(0, CHUNK)
    experts = tl.load(ids_ptr + pairs, mask=pairs < num_pairs, other=E_PAD)
    one_hot = (experts[:, None] == tl.arange(0, E_PAD)[None, :]).to(tl.int32)
    before = tl.cumsum(one_hot, axis=0) - one_hot
    tl.store(rank_ptr + pairs, tl.sum(before * one_hot, axis=1), mask=pairs < num_pairs)
    columns = tl.arange(0, E_PAD)
    tl.store(counts_ptr + chunk * E + columns, tl.sum(one_hot, axis=0), mask=columns < E)


@triton.jit(do_not_specialize=["num_chunks", "max_blocks"])
def _expert_offsets_kernel(counts_ptr, offsets_ptr, starts_ptr, block_expert_ptr, num_padded_ptr, num_chunks,
                           max_blocks, E: tl.constexpr, E_PAD: tl.constexpr, ROWS: tl.constexpr,
                           BLOCK_M: tl.constexpr):
    """offsets[c, e]: expert e's pairs in chunks before c; starts[e]: the first row of e's run; num_padded: the rows;
    block_expert[t]: the expert of tile t (the last expert for tiles past the rows)."""
    columns = tl.arange(0, E_PAD)
    column_ok = columns < E
    total = tl.zeros([E_PAD], dtype=tl.int32)
    for first in range(0, num_chunks, ROWS):
        chunks = first + tl.arange(0, ROWS)
        where = chunks[:, None] * E + columns[None, :]
        mask = (chunks < num_chunks)[:, None] & column_ok[None, :]
        counts = tl.load(counts_ptr + where, mask=mask, other=0)
        tl.store(offsets_ptr + where, tl.cumsum(counts, axis=0) - counts + total[None, :], mask=mask)
        total += tl.sum(counts, axis=0)
    padded = (total + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    ends = tl.cumsum(padded, axis=0)
    tl.store(starts_ptr + columns, ends - padded, mask=column_ok)
    tl.store(num_padded_ptr, tl.sum(padded, axis=0))
    for first in range(0, max_blocks, ROWS):
        tiles = first + tl.arange(0, ROWS)
        passed = ((ends[None, :] <= tiles[:, None] * BLOCK_M) & column_ok[None, :]).to(tl.int32)
        tl.store(block_expert_ptr + tiles, tl.minimum(tl.sum(passed, axis=1), E - 1), mask=tiles < max_blocks)


@triton.jit(do_not_specialize=["num_pairs"])
def _place_pairs_kernel(ids_ptr, rank_ptr, offsets_ptr, starts_ptr, sorted_ids_ptr, num_pairs, E: tl.constexpr,
                        CHUNK: tl.constexpr):
    chunk = tl.program_id(0)
    pairs = chunk * CHUNK + tl.arange(0, CHUNK)
    ok = pairs < num_pairs
    experts = tl.load(ids_ptr + pairs, mask=ok, other=0)
    row = tl.load(starts_ptr + experts, mask=ok, other=0) + tl.load(rank_ptr + pairs, mask=ok, other=0)
    row += tl.load(offsets_ptr + chunk * E + experts, mask=ok, other=0)
    tl.store(sorted_ids_ptr + row, pairs, mask=ok)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] -> (sorted_ids, block_expert, num_padded).

    sorted_ids [max_blocks * block_m] int32: the pair indices (t * k + j) grouped by expert in order, each expert's
    run padded to a multiple of block_m with T * k; block_expert [max_blocks] int32: the expert of each tile of block_m
    rows; num_padded [1] int32: the rows in use (tiles past it are not). max_blocks = T * k // block_m + min(T * k, E)
    bounds the tiles for any routing.
    """
    ids = topk_ids.flatten().to(torch.int32)
    num_pairs = ids.numel()
    max_blocks = num_pairs // block_m + min(num_pairs, num_experts)
    e_pad = triton.next_power_of_2(num_experts)
    chunk = max(16, _TILE_ELEMENTS // e_pad)
    num_chunks = triton.cdiv(num_pairs, chunk)
    device = ids.device
    counts = torch.empty(num_chunks, num_experts, dtype=torch.int32, device=device)
    offsets = torch.empty_like(counts)
    rank = torch.empty(num_pairs, dtype=torch.int32, device=device)
    starts = torch.empty(num_experts, dtype=torch.int32, device=device)
    block_expert = torch.empty(max_blocks, dtype=torch.int32, device=device)
    num_padded = torch.empty(1, dtype=torch.int32, device=device)
    sorted_ids = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int32, device=device)
    _count_chunks_kernel[(num_chunks,)](ids, counts, rank, num_pairs, E=num_experts, E_PAD=e_pad, CHUNK=chunk)
    _expert_offsets_kernel[(1,)](counts, offsets, starts, block_expert, num_padded, num_chunks, max_blocks,
                                 E=num_experts, E_PAD=e_pad, ROWS=chunk, BLOCK_M=block_m)
    _place_pairs_kernel[(num_chunks,)](ids, rank, offsets, starts, sorted_ids, num_pairs, E=num_experts, CHUNK=chunk)
    return sorted_ids, block_expert, num_padded
