"""The tensor-parallel all-reduce of a row-parallel layer's output fused with the residual add and the RMSNorm after
it, for a decode step's few rows, over peer GPU memory (torch's symmetric memory): one kernel where there were two
(torch's one-shot all-reduce, then kernels/rms_norm.py's), and one barrier between the ranks where that all-reduce
has two.

A launch has PROGRAMS programs, and program p owns rows p, p + PROGRAMS, ... at every call, on every rank. Each
rank's symmetric memory holds a buffer of rows and two flags for each program and rank: `ready` (that rank has
stored its rows of program p) and `done` (that rank has read this rank's rows of program p). Program p:
1. waits until each peer is done with its rows of the last call (the flags start set), so that it may overwrite
   them: a one-shot all-reduce's closing barrier, moved to the next call, where it has long been met;
2. stores its rows of x into this rank's buffer and sets its `ready` on each peer;
3. waits for each peer's `ready`, sums the rows of every rank's buffer in rank order (so that every rank gets the
   same bits) and sets its `done` on each peer;
4. adds the residual and norms as kernels/rms_norm.py does, rounding where it rounds.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wick.kernels.pdl import pdl_options, pdl_prologue
from wick.kernels.rms_norm import normalize_rows

PROGRAMS = 16
FLAGS_PER_RANK = 2 * PROGRAMS  # a ready and a done flag for each program


def reset_flags(flags: torch.Tensor) -> None:
    """A rank's flags (int32, FLAGS_PER_RANK for each rank) before the first call: no rank ready, and every rank
    done with the rows of the call before (there is none)."""
    ready = flags.numel() // 2
    flags[:ready] = 0
    flags[ready:] = 1


@triton.jit
def _wait_and_clear(flag_ptr):
    """Spins until the flag is set, then clears it; what its setter wrote before setting it is then visible."""
    while tl.atomic_cas(flag_ptr, 1, 0, sem="acquire", scope="sys") != 1:
        pass


@triton.jit
def _set_on_peers(flag_ptrs, offset, rank, WORLD: tl.constexpr):
    """Sets the flag at `offset` in every other rank's flags, after every thread's memory operations before it."""
    tl.debug_barrier()
    for q in tl.static_range(WORLD):
        if q != rank:
            flags = tl.load(flag_ptrs + q).to(tl.pointer_type(tl.int32))
            tl.atomic_xchg(flags + offset, 1, sem="release", scope="sys")


@triton.jit(do_not_specialize=["num_rows", "rank"])
def _all_reduce_rms_norm_kernel(
    x_ptr, residual_ptr, weight_ptr, out_ptr, buffer_ptrs, flag_ptrs, num_rows, rank, eps,
    WORLD: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, ROWS: tl.constexpr,
    PDL: tl.constexpr,
):
    """flags (int32, on every rank): ready[program][rank], then done[program][rank]. The rank is an argument, not a
    constant: ranks that share a process (tests) share the compiled kernel, which a rank must not load while the
    other's spins (loading a module may wait for the GPU's running kernels)."""
    program = tl.program_id(0)
    ready = program * WORLD
    done = (tl.num_programs(0) + program) * WORLD
    flags = tl.load(flag_ptrs + rank).to(tl.pointer_type(tl.int32))
    for q in tl.static_range(WORLD):
        if q != rank:
            _wait_and_clear(flags + done + q)
    pdl_prologue(PDL)
    rows = (program + tl.num_programs(0) * tl.arange(0, ROWS)).to(tl.int64)
    cols = tl.arange(0, BLOCK_D)
    mask = (rows < num_rows)[:, None] & (cols < D)[None, :]
    offsets = rows[:, None] * D + cols[None, :]
    dtype = x_ptr.dtype.element_ty
    own = tl.multiple_of(tl.load(buffer_ptrs + rank).to(tl.pointer_type(dtype)), 16)
    tl.store(own + offsets, tl.load(x_ptr + offsets, mask=mask, other=0.0), mask=mask)
    _set_on_peers(flag_ptrs, ready + rank, rank, WORLD)
    for q in tl.static_range(WORLD):
        if q != rank:
            _wait_and_clear(flags + ready + q)
    total = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
    for q in tl.static_range(WORLD):
        rank_rows = tl.multiple_of(tl.load(buffer_ptrs + q).to(tl.pointer_type(dtype)), 16)
        total += tl.load(rank_rows + offsets, mask=mask, other=0.0, volatile=True).to(tl.float32)
    _set_on_peers(flag_ptrs, done + rank, rank, WORLD)
    residual = tl.load(residual_ptr + offsets, mask=mask, other=0.0)
    x = (total.to(dtype).to(tl.float32) + residual.to(tl.float32)).to(dtype)
    tl.store(residual_ptr + offsets, x, mask=mask)
    out = normalize_rows(x, weight_ptr, cols, eps, D).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + offsets, out, mask=mask)


def all_reduce_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                        buffer_ptrs: torch.Tensor, flag_ptrs: torch.Tensor, rank: int) -> torch.Tensor:
    """residual += (x summed over the ranks) in place, both rounded to x's dtype; returns rms_norm(residual) * weight.
    x and residual [T, D] contiguous; buffer_ptrs and flag_ptrs (int64, on x's device) the addresses of every rank's
    symmetric buffer of at least T * D elements of x's dtype and of its flags (reset_flags)."""
    rows, dim = x.shape
    out = torch.empty_like(x)
    block_d = triton.next_power_of_2(dim)
    rows_each = triton.next_power_of_2(triton.cdiv(rows, PROGRAMS))
    _all_reduce_rms_norm_kernel[(PROGRAMS,)](
        x, residual, weight, out, buffer_ptrs, flag_ptrs, rows, rank, eps,
        WORLD=buffer_ptrs.numel(), D=dim, BLOCK_D=block_d, ROWS=rows_each,
        num_warps=min(16, max(4, rows_each * block_d // 512)), **pdl_options(x),
        enable_fp_fusion=False,  # as kernels/rms_norm.py, so that the norm rounds as there
    )
    return out
