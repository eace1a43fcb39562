"""x @ W^T with W in GGUF blocks.

For a few rows of x (decode) W is dequantized inside a GEMV kernel, its packed bytes read once: one program
owns BLOCK_N rows of W and walks their blocks along K, decoding a [BLOCK_N, block size] tile in registers per
step and reducing it against a row of x. Q4_K, Q6_K and Q8_0 have GEMVs of their own on x rounded to int8
(gguf_int8_gemv.py). From 9 to TILE_MAX_ROWS rows Q4_K and Q6_K run the tile kernel of gguf_tiles.py, their bytes
read once a tile of rows. Otherwise (prefill, other types, layers small enough that their decoded copy stays in
the L2 cache) W is decoded whole into x's dtype and cuBLAS multiplies. The decoding of every type follows
wick/loader/gguf_dequant.py, which is the reference in the tests.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from wick.kernels.gguf_int8_gemv import launch_int8_gemv, runs_int8_gemv
from wick.kernels.gguf_tiles import TILE_MAX_ROWS, runs_tiles, tile_matmul
from wick.loader.gguf_dequant import IQ4_LEVELS

T = GGMLQuantizationType
_CODES = {T.Q4_0: 0, T.Q4_1: 1, T.Q5_0: 2, T.Q5_1: 3, T.Q8_0: 4, T.Q2_K: 5, T.Q3_K: 6, T.Q4_K: 7, T.Q5_K: 8,
          T.Q6_K: 9, T.IQ4_NL: 10, T.IQ4_XS: 11}
TRITON_TYPES: frozenset[GGMLQuantizationType] = frozenset(_CODES)
# Rows of x up to which the GEMV form runs.
GEMV_MAX_ROWS = 8


@triton.jit
def _byte(block, offset):
    return tl.load(block + offset).to(tl.int32)


@triton.jit
def _f16(block, offset):
    bits = tl.load(block + offset).to(tl.uint16) | (tl.load(block + offset + 1).to(tl.uint16) << 8)
    return bits.to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def _k_scale_min(block, sub):
    """The 6-bit scale and min of sub-block `sub` (0..7) of a Q4_K / Q5_K block."""
    low = sub < 4
    j = sub % 4
    a = _byte(block, 4 + j)
    m = _byte(block, 8 + j)
    c = _byte(block, 12 + j)
    scale = tl.where(low, a & 63, (c & 15) | ((a >> 6) << 4))
    minimum = tl.where(low, m & 63, (c >> 4) | ((m >> 6) << 4))
    return scale.to(tl.float32), minimum.to(tl.float32)


@triton.jit
def _decode(block, e, levels_ptr, QTYPE: tl.constexpr):
    """Values of elements e ([BLOCK_N, BS] offsets in the block) of blocks at `block` ([BLOCK_N, 1] pointers);
    levels_ptr: IQ4's sixteen levels."""
    if QTYPE == 0:  # Q4_0
        q = (_byte(block, 2 + e % 16) >> ((e // 16) * 4)) & 15
        w = (q - 8).to(tl.float32) * _f16(block, 0)
    elif QTYPE == 1:  # Q4_1
        q = (_byte(block, 4 + e % 16) >> ((e // 16) * 4)) & 15
        w = q.to(tl.float32) * _f16(block, 0) + _f16(block, 2)
    elif QTYPE == 2:  # Q5_0
        high = (_byte(block, 2 + e // 8) >> (e % 8)) & 1
        q = ((_byte(block, 6 + e % 16) >> ((e // 16) * 4)) & 15) | (high << 4)
        w = (q - 16).to(tl.float32) * _f16(block, 0)
    elif QTYPE == 3:  # Q5_1
        high = (_byte(block, 4 + e // 8) >> (e % 8)) & 1
        q = ((_byte(block, 8 + e % 16) >> ((e // 16) * 4)) & 15) | (high << 4)
        w = q.to(tl.float32) * _f16(block, 0) + _f16(block, 2)
    elif QTYPE == 4:  # Q8_0
        q = tl.load(block + 2 + e).to(tl.int8, bitcast=True)
        w = q.to(tl.float32) * _f16(block, 0)
    elif QTYPE == 5:  # Q2_K
        half, plane, lane, sub = e // 128, (e % 128) // 32, e % 32, e // 16
        q = (_byte(block, 16 + half * 32 + lane) >> (2 * plane)) & 3
        scales = _byte(block, sub)
        w = _f16(block, 80) * (scales & 15).to(tl.float32) * q.to(tl.float32) \
            - _f16(block, 82) * (scales >> 4).to(tl.float32)
    elif QTYPE == 6:  # Q3_K
        half, plane, lane, sub = e // 128, (e % 128) // 32, e % 32, e // 16
        low = (_byte(block, 32 + half * 32 + lane) >> (2 * plane)) & 3
        high = (_byte(block, lane) >> (4 * half + plane)) & 1
        q = low - 4 * (1 - high)
        low4 = (_byte(block, 96 + sub % 8) >> ((sub // 8) * 4)) & 15
        high2 = (_byte(block, 104 + sub % 4) >> (2 * (sub // 4))) & 3
        scale = (low4 | (high2 << 4)) - 32
        w = _f16(block, 108) * scale.to(tl.float32) * q.to(tl.float32)
    elif QTYPE == 7:  # Q4_K
        sub = e // 32
        q = (_byte(block, 16 + (sub // 2) * 32 + e % 32) >> ((sub % 2) * 4)) & 15
        scale, minimum = _k_scale_min(block, sub)
        w = _f16(block, 0) * scale * q.to(tl.float32) - _f16(block, 2) * minimum
    elif QTYPE == 8:  # Q5_K
        sub = e // 32
        low = (_byte(block, 48 + (sub // 2) * 32 + e % 32) >> ((sub % 2) * 4)) & 15
        q = low | (((_byte(block, 16 + e % 32) >> sub) & 1) << 4)
        scale, minimum = _k_scale_min(block, sub)
        w = _f16(block, 0) * scale * q.to(tl.float32) - _f16(block, 2) * minimum
    elif QTYPE == 10:  # IQ4_NL
        q = (_byte(block, 2 + e % 16) >> ((e // 16) * 4)) & 15
        w = tl.load(levels_ptr + q) * _f16(block, 0)
    elif QTYPE == 11:  # IQ4_XS
        sub, lane = e // 32, e % 32
        q = (_byte(block, 8 + sub * 16 + lane % 16) >> ((lane // 16) * 4)) & 15
        low = (_byte(block, 4 + sub // 2) >> ((sub % 2) * 4)) & 15
        high = ((_byte(block, 2) | (_byte(block, 3) << 8)) >> (2 * sub)) & 3
        w = _f16(block, 0) * ((low | (high << 4)) - 32).to(tl.float32) * tl.load(levels_ptr + q)
    else:  # Q6_K
        half, plane, lane = e // 128, (e % 128) // 32, e % 32
        low = (_byte(block, half * 64 + (plane % 2) * 32 + lane) >> ((plane // 2) * 4)) & 15
        high = (_byte(block, 128 + half * 32 + lane) >> (2 * plane)) & 3
        q = (low | (high << 4)) - 32
        scale = tl.load(block + 192 + e // 16).to(tl.int8, bitcast=True)
        w = _f16(block, 208) * scale.to(tl.float32) * q.to(tl.float32)
    return w


@triton.jit
def _gguf_gemv_kernel(x_ptr, w_ptr, levels_ptr, out_ptr, N, stride_xm, row_bytes, stride_om, K,
                      QTYPE: tl.constexpr, BS: tl.constexpr, TS: tl.constexpr, BLOCK_N: tl.constexpr):
    rows_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = rows_n < N
    # Rows past N read row 0 and are not stored.
    safe_n = tl.where(n_mask, rows_n, 0).to(tl.int64)
    e = tl.arange(0, BS)
    e2 = e[None, :] + tl.zeros([BLOCK_N, 1], dtype=tl.int32)
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    x_row = x_ptr + tl.program_id(0).to(tl.int64) * stride_xm
    for b in range(0, K // BS):
        w = _decode(w_ptr + safe_n[:, None] * row_bytes + b * TS, e2, levels_ptr, QTYPE)
        x = tl.load(x_row + b * BS + e).to(tl.float32)
        acc += tl.sum(w * x[None, :], axis=1)
    out = out_ptr + tl.program_id(0).to(tl.int64) * stride_om + rows_n
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=n_mask)


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
        w = _decode(w_ptr + safe_n[:, None] * row_bytes + b * TS, e2, levels_ptr, QTYPE)
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
        data, _levels(data.device), out, n, data.stride(0), out.stride(0),
        QTYPE=_CODES[qtype], BS=block_size, TS=type_size, BLOCK_N=block_n, BLOCK_B=block_b)
    return out


@functools.cache
def _levels(device: torch.device) -> torch.Tensor:
    # Made on the first (eager) call, before any CUDA graph capture.
    return torch.tensor(IQ4_LEVELS, dtype=torch.float32, device=device)


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
    gemv_config: (rows, blocks a step, warps, warps an SM that splitting K aims at) of the int8 GEMV and
    split_k its splits of K (of either kernel); tile_config: (BLOCK_M, BLOCK_N, K_STEP, warps, stages) of the
    tile kernel (Q4_K, Q6_K, Q8_0) and tile_max_rows the most rows it takes; for benchmarks and tests, None picks
    them (no rows where W dequantized stays in the L2 cache)."""
    n, k = shape
    block_size, type_size = GGML_QUANT_SIZES[qtype]
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
    elif runs_int8_gemv(qtype, data):
        launch_int8_gemv(x2, data, qtype, out, None, 1, gemv_config, split_k)
    else:
        block_n = 32 if block_size == 256 else 64
        _gguf_gemv_kernel[(m, triton.cdiv(n, block_n))](
            x2, data, _levels(x.device), out, n, x2.stride(0), data.stride(0), out.stride(0), k,
            QTYPE=_CODES[qtype], BS=block_size, TS=type_size, BLOCK_N=block_n)
    return out.reshape(*x.shape[:-1], n)
