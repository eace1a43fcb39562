"""x @ W^T with W in GGUF blocks.

For a few rows of x (decode) W is dequantized inside a GEMV kernel, its packed bytes read once. Every type has a GEMV of
its own on x rounded to int8 (gguf_int8_gemv.py); weights it cannot read (rows off word boundaries, 32-value blocks not
in whole groups of eight) take a float GEMV: one program owns BLOCK_N rows of W and walks their blocks along K, decoding
a [BLOCK_N, block size] tile in registers per step and reducing it against a row of x. From 9 to the type's
TILE_MAX_ROWS rows (every type but Q4_0, Q4_1, Q8_0 and Q3_K, whose decoded path was as fast) the tile kernel of
gguf_tiles.py runs, its bytes read once a tile of rows. Otherwise (prefill, those types, layers small enough that their
decoded copy stays in the L2 cache) W is decoded whole into x's dtype and cuBLAS multiplies. The GEMVs also run packed
experts, each output row a (token, expert) pair whose expert the kernel picks.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from wick.kernels.gemv_split import SplitK, fit_grid_rows, store_split_output
from wick.kernels.gguf_decode import TRITON_CODES, TRITON_TYPES, decode, iq4_levels
from wick.kernels.gguf_int8_gemv import launch_int8_gemv, runs_int8_gemv
from wick.kernels.gguf_tiles import TILE_MAX_ROWS, runs_tiles, tile_matmul
from wick.kernels.int8_activations import Int8Rows

# Rows of x up to which the GEMV form runs.
GEMV_MAX_ROWS = 8
# Rows of W per program, blocks per step, warps, and the warps an SM that splitting K aims at (0: no split) of the
# float GEMV, which weights the int8 GEMVs cannot read take, by their values a block (benchmarks/kernels/
# bench_quant_gemv.py --sweep; Llama-3.1-8B's layers in Q3_K on an H100: 297 us against 420 at (32, 1, 4, 16)).
FLOAT_GEMV_CONFIGS = {256: (8, 1, 2, 32), 32: (32, 1, 4, 16)}


@triton.jit
def _gguf_gemv_kernel(x_ptr, w_ptr, levels_ptr, out_ptr, work_ptr, counts_ptr, experts_ptr, expert_bytes, M, N,
                      stride_xm, row_bytes, stride_om, K, SPLIT_BLOCKS, SPLITS, QTYPE: tl.constexpr,
                      BS: tl.constexpr, TS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr,
                      SPLIT: tl.constexpr, EXPERTS: tl.constexpr, X_ROW_DIV: tl.constexpr):
    """Output row program_id(0) over BLOCK_N rows of W, BLOCK_B blocks a step, each block decoded to floats. Where
    SPLIT, program (.., .., s) takes SPLIT_BLOCKS blocks from block s * SPLIT_BLOCKS (gemv_split.py). Where EXPERTS
    the output rows are (token, expert) pairs: W the pair's expert (experts_ptr[pair], expert_bytes apart) and x's
    row the pair's token (pair // X_ROW_DIV)."""
    pair = tl.program_id(0).to(tl.int64)
    if EXPERTS:
        w_ptr += tl.load(experts_ptr + pair).to(tl.int64) * expert_bytes
    rows_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows_n < N
    # Rows past N read row 0 and are not stored.
    blocks = w_ptr + tl.where(n_mask, rows_n, 0).to(tl.int64)[:, None] * row_bytes
    e = tl.arange(0, BS)
    e2 = e[None, :] + tl.zeros([BLOCK_N, 1], dtype=tl.int32)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    x_row = x_ptr + (pair // X_ROW_DIV) * stride_xm
    b_begin = tl.program_id(2) * SPLIT_BLOCKS
    for b0 in range(b_begin, tl.minimum(K // BS, b_begin + SPLIT_BLOCKS), BLOCK_B):
        for bb in tl.static_range(BLOCK_B):
            b = b0 + bb
            w = decode(blocks + b * TS, e2, levels_ptr, QTYPE)
            x = tl.load(x_row + b * BS + e).to(tl.float32)
            acc += tl.sum(w * x[None, :], axis=1)
    store_split_output(acc, tl.program_id(0), rows_n, n_mask, out_ptr, stride_om, work_ptr, counts_ptr, M, N, SPLITS,
                       SPLIT)


@triton.jit
def _dequantize_kernel(w_ptr, levels_ptr, out_ptr, N, row_bytes, stride_on,
                       QTYPE: tl.constexpr, BS: tl.constexpr, TS: tl.constexpr, BLOCK_N: tl.constexpr,
                       BLOCK_B: tl.constexpr):
    """BLOCK_N rows of W times BLOCK_B of their blocks, decoded to out [N, K]."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows < N
    safe_n = tl.where(n_mask, rows, 0).to(tl.int64)
    e = tl.arange(0, BS)
    e2 = e[None, :] + tl.zeros([BLOCK_N, 1], dtype=tl.int32)
    for bb in tl.static_range(BLOCK_B):
        b = tl.program_id(1) * BLOCK_B + bb
        w = decode(w_ptr + safe_n[:, None] * row_bytes + b * TS, e2, levels_ptr, QTYPE)
        out = out_ptr + safe_n[:, None] * stride_on + b * BS + e[None, :]
        tl.store(out, w.to(out_ptr.dtype.element_ty), mask=n_mask[:, None])


def gguf_dequantize(data: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int],
                    dtype: torch.dtype) -> torch.Tensor:
    """W [N, K] in `dtype` from `data` [N, row bytes] of `qtype` blocks (a Triton type)."""
    n, k = shape
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    out = torch.empty(n, k, dtype=dtype, device=data.device)
    blocks = k // block_size
    block_b = math.gcd(blocks, max(1, 256 // block_size))
    block_n = 16
    _dequantize_kernel[(triton.cdiv(n, block_n), blocks // block_b)](
        data, iq4_levels(data.device), out, n, data.stride(0), out.stride(0),
        QTYPE=TRITON_CODES[qtype], BS=block_size, TS=type_size, BLOCK_N=block_n, BLOCK_B=block_b)
    return out


@functools.cache
def _l2_bytes(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).L2_cache_size


def _dequantized_stays_in_l2(weights: int, x: torch.Tensor) -> bool:
    """Whether W dequantized into x's dtype is small enough to stay in the L2 cache between the dequantizing
    kernel and cuBLAS (a quarter of it): then the copy costs little and cuBLAS beats the tile kernel."""
    return x.is_cuda and weights * x.element_size() <= _l2_bytes(x.device) // 4


def gguf_matmul(x: torch.Tensor, data: torch.Tensor, qtype: GGMLQuantizationType,
                shape: tuple[int, int], gemv_config: tuple[int, int, int, int] | None = None,
                split_k: int | None = None, tile_config: tuple[int, int, int, int, int] | None = None,
                tile_max_rows: int | None = None) -> torch.Tensor:
    """x [..., K] @ W^T for W of `shape` (N, K) stored as `data` [N, row bytes] of `qtype` blocks.
    gemv_config: (rows, blocks a step, warps, warps an SM that splitting K aims at) of the GEMV and
    split_k its splits of K (of either kernel); tile_config: (BLOCK_M, BLOCK_N, K_STEP, warps, stages) of the
    tile kernel and tile_max_rows the most rows it takes; for benchmarks and tests, None picks
    them (no rows where W dequantized stays in the L2 cache)."""
    n, k = shape
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    if m > GEMV_MAX_ROWS:
        if tile_max_rows is None:
            tile_max_rows = 0 if _dequantized_stays_in_l2(n * k, x) else TILE_MAX_ROWS.get(qtype, 0)
        if not runs_tiles(qtype, data) or m > tile_max_rows:
            return (x2 @ gguf_dequantize(data, qtype, shape, x.dtype).t()).reshape(*x.shape[:-1], n)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*x.shape[:-1], n)
    if m > GEMV_MAX_ROWS:
        tile_matmul(x2, data, qtype, out, tile_config, split_k)
    else:
        _gemv(x2, data, qtype, out, None, 1, gemv_config, split_k)
    return out.reshape(*x.shape[:-1], n)


def gguf_int8_rows_matmul(x: Int8Rows, data: torch.Tensor, qtype: GGMLQuantizationType, n: int,
                          dtype: torch.dtype) -> torch.Tensor:
    """x's rows (at most GEMV_MAX_ROWS), already rounded to int8, @ W^T -> [M, n] in `dtype` by the int8 GEMV of
    `qtype`, where runs_int8_gemv(qtype, data)."""
    out = torch.empty(x.q.shape[0], n, dtype=dtype, device=x.q.device)
    launch_int8_gemv(x, data, qtype, out, None, 1, None, None)
    return out


def _gemv(x: torch.Tensor | Int8Rows, data: torch.Tensor, qtype: GGMLQuantizationType, out: torch.Tensor,
          experts: torch.Tensor | None, x_row_div: int, gemv_config: tuple[int, int, int, int] | None,
          split_k: int | None) -> None:
    """out [rows, N] = each row's x row @ W^T: the type's int8 GEMV where it has one, else the float one; data
    [N, row bytes], or with `experts` (each output row's expert) [experts, N, row bytes], x's row then the output
    row // x_row_div."""
    if runs_int8_gemv(qtype, data.view(-1, data.shape[-1])):
        launch_int8_gemv(x, data, qtype, out, experts, x_row_div, gemv_config, split_k)
        return
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    m, n = out.shape
    k = x.shape[1]
    block_n, block_b, warps, split_warps = gemv_config or FLOAT_GEMV_CONFIGS[block_size]
    block_n = fit_grid_rows(n, block_n)
    block_b = math.gcd(block_b, k // block_size)
    grid = (m, triton.cdiv(n, block_n))
    split = SplitK(k // block_size // block_b, m * grid[1], warps, split_warps, out, split_k)
    _gguf_gemv_kernel[(*grid, split.splits)](
        x, data, iq4_levels(x.device), out, split.work, split.counts, out if experts is None else experts,
        0 if experts is None else data.stride(0), m, n, x.stride(0), data.stride(-2), out.stride(0), k,
        split.steps * block_b, split.splits, QTYPE=TRITON_CODES[qtype], BS=block_size, TS=type_size, BLOCK_N=block_n,
        BLOCK_B=block_b, SPLIT=split.splits > 1, EXPERTS=experts is not None, X_ROW_DIV=x_row_div, num_warps=warps)


def runs_expert_gemv(data: torch.Tensor, qtype: GGMLQuantizationType) -> bool:
    """Whether gguf_expert_gemv runs experts `data` [experts, N, row bytes] of `qtype`."""
    return data.is_cuda and data.is_contiguous() and qtype in TRITON_TYPES


def runs_expert_int8_gemv(data: torch.Tensor, qtype: GGMLQuantizationType) -> bool:
    """Whether gguf_expert_gemv runs experts `data` [experts, N, row bytes] of `qtype` by an int8 GEMV (which then
    takes x's rows already rounded, Int8Rows)."""
    return runs_expert_gemv(data, qtype) and runs_int8_gemv(qtype, data.view(-1, data.shape[-1]))


def gguf_expert_gemv(x: torch.Tensor | Int8Rows, data: torch.Tensor, qtype: GGMLQuantizationType, k: int,
                     experts: torch.Tensor, x_row_div: int, split_k: int | None = None,
                     dtype: torch.dtype | None = None) -> torch.Tensor:
    """out [P, N]: row p = x[p // x_row_div] @ W_{experts[p]}^T for experts `data` [E, N, row bytes] of `qtype` over
    k columns, where runs_expert_gemv(data, qtype); x may come rounded to int8 (quantize_q8's) where
    runs_expert_int8_gemv, with `dtype` the output's. split_k: the splits of K, for tests; None picks them."""
    rounded = isinstance(x, Int8Rows)
    out = torch.empty(experts.numel(), data.shape[1], dtype=dtype if rounded else x.dtype, device=data.device)
    if out.shape[0]:
        _gemv(x if rounded else x.reshape(-1, k).contiguous(), data, qtype, out, experts, x_row_div, None, split_k)
    return out
