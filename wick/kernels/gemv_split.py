"""Splitting K of a GEMV among programs where its output columns alone leave the SMs short of warps (a
memory-bound kernel needs many loads in flight on every SM). Each split writes its float32 partial sums to a
workspace [splits, M, N] and counts itself in per output tile; the tile's last split to arrive adds them
into the output and resets the count, so a split GEMV is still one launch."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

# Output tiles (rows of x times column tiles) the arrival counts cover; a GEMV with more is not split.
MAX_TILES = 1 << 20
# Programs a CUDA grid holds along its second dimension, where the GEMVs put their tiles of W's rows.
MAX_GRID_Y = 65535


def fit_grid_rows(n: int, block_n: int) -> int:
    """Rows of W a GEMV program takes: block_n, doubled until the tiles of n rows fit the grid (Gemma 3's LM head,
    262,208 rows, in tiles of 4)."""
    while triton.cdiv(n, block_n) > MAX_GRID_Y:
        block_n *= 2
    return block_n


@functools.cache
def _arrival_counts(device: torch.device) -> torch.Tensor:
    # Made on the first (eager) call, before any CUDA graph capture; every split program leaves its count at 0.
    return torch.zeros(MAX_TILES, dtype=torch.int32, device=device)


class SplitK:
    """The splits of one GEMV launch: `splits`, `steps` (of each split), and the kernel's `work` and `counts`
    arguments (the output itself where K is not split)."""

    def __init__(self, steps: int, tiles: int, warps: int, warps_per_sm: int, out: torch.Tensor,
                 splits: int | None = None) -> None:
        """steps: the kernel's steps along K; tiles: the grid's programs without splitting (its output tiles);
        warps: each program's; warps_per_sm: the warps an SM that splitting aims at (0: none); splits: a fixed
        count instead, for benchmarks and tests."""
        if splits is None:
            sms = (torch.cuda.get_device_properties(out.device).multi_processor_count
                   if out.device.type == "cuda" else 1)
            splits = max(1, min(triton.cdiv(warps_per_sm * sms, tiles * warps), steps // 2)) if warps_per_sm else 1
        if tiles > MAX_TILES:
            splits = 1
        self.steps = triton.cdiv(steps, splits)
        self.splits = triton.cdiv(steps, self.steps)
        self.work = out
        self.counts = out
        if self.splits > 1:
            self.work = torch.empty(self.splits, *out.shape, dtype=torch.float32, device=out.device)
            self.counts = _arrival_counts(out.device)


@triton.jit
def store_split_output(acc, rows, cols, mask, out_ptr, stride_om, work_ptr, counts_ptr, M, N, SPLITS,
                       SPLIT: tl.constexpr):
    """Stores program (m, tile, split)'s sums `acc` for rows `rows` (the program's row of x, or a tile of them
    broadcast against `cols`) and output columns `cols`: directly, or where SPLIT as one of SPLITS partial sums,
    the last to arrive adding them all into out."""
    rows = rows.to(tl.int64)
    if SPLIT:
        tl.store(work_ptr + (tl.program_id(2) * M + rows) * N + cols, acc, mask=mask)
        tl.debug_barrier()
        tile = tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)
        if tl.atomic_add(counts_ptr + tile, 1, sem="acq_rel") == SPLITS - 1:
            total = tl.zeros_like(acc)
            for s in range(0, SPLITS):
                total += tl.load(work_ptr + (s * M + rows) * N + cols, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(out_ptr + rows * stride_om + cols, total.to(out_ptr.dtype.element_ty), mask=mask)
            tl.atomic_xchg(counts_ptr + tile, 0)
    else:
        tl.store(out_ptr + rows * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)
