"""x @ W^T with W in GGUF blocks.

For a few rows of x (decode) W is dequantized inside a GEMV kernel, its packed bytes read once: one program
owns BLOCK_N rows of W and walks their blocks along K, decoding a [BLOCK_N, block size] tile in registers per
step and reducing it against a row of x. The Q4_K and Q6_K GEMVs first round x to int8 in runs of 32, as
llama.cpp does, and multiply a word's codes by it four at a time (dp4a), since decoding each weight to a float
cost more instructions than its bytes took to arrive. From 9 to Q4_K_TILE_MAX_ROWS rows Q4_K W is decoded a tile at a
time in registers for tl.dot (out^T = W x^T), its bytes read once a tile of rows. Otherwise (prefill, other
types, layers small enough that their decoded copy stays in the L2 cache) W is decoded whole into x's dtype
and cuBLAS multiplies. The decoding of every type follows wick/loader/gguf_dequant.py, which is the reference
in the tests.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from wick.kernels.gemv_split import SplitK, store_split_output
from wick.kernels.int8_activations import DP4A, dp4a, quantize_q8
from wick.loader.gguf_dequant import IQ4_LEVELS

T = GGMLQuantizationType
_CODES = {T.Q4_0: 0, T.Q4_1: 1, T.Q5_0: 2, T.Q5_1: 3, T.Q8_0: 4, T.Q2_K: 5, T.Q3_K: 6, T.Q4_K: 7, T.Q5_K: 8,
          T.Q6_K: 9, T.IQ4_NL: 10, T.IQ4_XS: 11}
TRITON_TYPES: frozenset[GGMLQuantizationType] = frozenset(_CODES)
# Rows of x up to which the GEMV form runs.
GEMV_MAX_ROWS = 8
# Rows of x up to which Q4_K runs the tile kernel; past them W is dequantized whole for cuBLAS.
Q4_K_TILE_MAX_ROWS = 256
# (BLOCK_M, BLOCK_N, PAIRS, warps, stages) of the Q4_K tile kernel by the most rows they serve
# (benchmarks/kernels/bench_quant_gemm.py --sweep at 16, 64 and 256 rows on an H100); past the last, the last.
Q4_K_TILE_CONFIGS: list[tuple[int, tuple[int, int, int, int, int]]] = [
    (16, (16, 64, 2, 4, 3)),
    (32, (32, 64, 2, 8, 3)),
    (64, (64, 128, 2, 8, 3)),
    (128, (128, 64, 2, 8, 3)),
    (1 << 62, (256, 64, 2, 8, 3)),
]
# Warps an SM that splitting K of the tile kernel aims at.
Q4_K_TILE_SPLIT_WARPS = 16
# Rows of W per program, blocks per step, warps, and the warps an SM that splitting K aims at (0: no split)
# of the Q4_K GEMV (benchmarks/kernels/bench_quant_gemv.py).
Q4_K_GEMV_CONFIG = (8, 2, 1, 16)
# The same for the Q6_K GEMV.
Q6_K_GEMV_CONFIG = (4, 1, 1, 16)


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


@triton.jit
def _q4_k_q8_gemv_kernel(xq_ptr, xd_ptr, xs_ptr, w_ptr, out_ptr, work_ptr, counts_ptr, experts_ptr, expert_bytes,
                         M, N, K, row_words, SPLIT_BLOCKS, SPLITS, stride_om,
                         BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT: tl.constexpr, DP4A: tl.constexpr,
                         EXPERTS: tl.constexpr, X_ROW_DIV: tl.constexpr):
    """x @ W^T for one row of x, quantized by _quantize_q8_kernel, and BLOCK_N rows of Q4_K W, BLOCK_B
    blocks a step; the blocks read as int32 words (0: d, dmin; 1-3: the scales; 4-35: the codes). Word
    4 + 8j + i holds in byte b the elements 64j + 4i + b (low nibble, sub-block 2j) and 64j + 32 + 4i + b
    (high nibble, sub-block 2j + 1): four consecutive elements of x, one int32 word of its int8 codes, so
    each nibble plane of a word meets x in one dp4a. A sub-block's integer sum then takes its scales once.
    Where SPLIT, program (.., .., s) takes SPLIT_BLOCKS blocks from block s * SPLIT_BLOCKS (gemv_split.py).
    EXPERTS and X_ROW_DIV as in _gemv_rows."""
    w_ptr, x_words, runs, rows, n_mask = _gemv_rows(w_ptr, xq_ptr, experts_ptr, expert_bytes, N, K, BLOCK_N,
                                                    EXPERTS, X_ROW_DIV)
    words = w_ptr.to(tl.pointer_type(tl.int32))
    row_base = tl.where(n_mask, rows, 0).to(tl.int64) * row_words
    j = tl.arange(0, 4)
    i = tl.arange(0, 8)
    low_sub = 2 * j[None, :]
    acc = tl.zeros([BLOCK_N, 4], dtype=tl.float32)
    b_begin = tl.program_id(2) * SPLIT_BLOCKS
    for b0 in range(b_begin, tl.minimum(K // 256, b_begin + SPLIT_BLOCKS), BLOCK_B):
        for bb in tl.static_range(BLOCK_B):
            blk = b0 + bb
            block = row_base + blk * 36
            head = tl.load(words + block)
            d = (head & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            dmin = ((head >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            a = tl.load(words + block + 1)[:, None]
            m = tl.load(words + block + 2)[:, None]
            c = tl.load(words + block + 3)[:, None]
            codes = tl.load(words + block[:, None, None] + 4 + 8 * j[None, :, None] + i[None, None, :])
            x_low = tl.load(x_words + blk * 64 + 16 * j[:, None] + i[None, :])
            x_high = tl.load(x_words + blk * 64 + 16 * j[:, None] + 8 + i[None, :])
            dot_low = tl.sum(dp4a(codes & 0x0F0F0F0F, x_low[None, :, :], DP4A), axis=2).to(tl.float32)
            dot_high = tl.sum(dp4a((codes >> 4) & 0x0F0F0F0F, x_high[None, :, :], DP4A), axis=2).to(tl.float32)
            scale_low, min_low = _k_scale_min_words(a, m, c, low_sub)
            scale_high, min_high = _k_scale_min_words(a, m, c, low_sub + 1)
            xd_low = tl.load(xd_ptr + runs + blk * 8 + 2 * j)[None, :]
            xd_high = tl.load(xd_ptr + runs + blk * 8 + 2 * j + 1)[None, :]
            xs_low = tl.load(xs_ptr + runs + blk * 8 + 2 * j)[None, :]
            xs_high = tl.load(xs_ptr + runs + blk * 8 + 2 * j + 1)[None, :]
            acc += (d[:, None] * (scale_low * xd_low * dot_low + scale_high * xd_high * dot_high)
                    - dmin[:, None] * (min_low * xs_low + min_high * xs_high))
    store_split_output(tl.sum(acc, axis=1), tl.program_id(0), rows, n_mask, out_ptr, stride_om, work_ptr,
                       counts_ptr, M, N, SPLITS, SPLIT)


@triton.jit(do_not_specialize=["M"])
def _q4_k_tile_kernel(x_ptr, w_ptr, out_ptr, work_ptr, counts_ptr, sorted_ptr, experts_ptr, padded_ptr, expert_bytes,
                      M, N, K, stride_xm, row_words, stride_om, SPLIT_PAIRS, SPLITS,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAIRS: tl.constexpr, SPLIT: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, SORTED: tl.constexpr, X_ROW_DIV: tl.constexpr):
    """out^T tile [BLOCK_N, BLOCK_M] = W tile @ x^T for Q4_K W, PAIRS pairs of sub-blocks (64 columns) a step:
    byte 32p + l of a block's codes holds element 64p + l in its low nibble and 64p + 32 + l in its high one.
    The step's codes are read as [BLOCK_N, PAIRS, 2, 32] (each byte twice, once a nibble) so that the decoded
    tile is in column order and x^T is read contiguously. W is the wide operand, the few rows of x the narrow
    one. Where SPLIT, program (.., .., s) takes SPLIT_PAIRS pairs from pair s * SPLIT_PAIRS (gemv_split.py).
    SORTED: the output rows are M (token, expert) pairs, tile i's the sorted pairs sorted_ptr[i * BLOCK_M + ...]
    of expert experts_ptr[i] (moe_align's layout, M for padding; tiles from padded_ptr[0] / BLOCK_M on have none),
    W that expert's (expert_bytes apart) and x's row a pair's token (pair // X_ROW_DIV)."""
    if SORTED:
        if tl.program_id(0) * BLOCK_M >= tl.load(padded_ptr):
            return
        rows = tl.load(sorted_ptr + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        w_ptr += tl.load(experts_ptr + tl.program_id(0)).to(tl.int64) * expert_bytes
    else:
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    words = w_ptr.to(tl.pointer_type(tl.int32))
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    m_mask = rows < M
    # Rows of W past N read row 0 and are not stored.
    row_base = tl.where(n_mask, cols, 0).to(tl.int64) * row_words
    p = tl.arange(0, PAIRS)[None, :, None]
    half = tl.arange(0, 2)[None, None, :]
    lane = tl.arange(0, 32)[None, None, None, :]
    ks = tl.arange(0, 64 * PAIRS)
    x_rows = x_ptr + (tl.where(m_mask, rows, 0) // X_ROW_DIV).to(tl.int64)[None, :] * stride_xm
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    p_begin = tl.program_id(2) * SPLIT_PAIRS
    for p0 in range(p_begin, tl.minimum(K // 64, p_begin + SPLIT_PAIRS), PAIRS):
        block = row_base + (p0 // 4) * 36
        head = tl.load(words + block)[:, None, None]
        d = (head & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        dmin = ((head >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        a = tl.load(words + block + 1)[:, None, None]
        m = tl.load(words + block + 2)[:, None, None]
        c = tl.load(words + block + 3)[:, None, None]
        scale, minimum = _k_scale_min_words(a, m, c, 2 * (p0 % 4 + p) + half)
        codes = tl.load((w_ptr + block * 4 + 16 + (p0 % 4) * 32)[:, None, None, None] + 32 * p[:, :, :, None]
                        + lane).to(tl.int32)
        # A code q in the float32 mantissa's top bits reads 1 + q / 16: no integer-to-float conversion, which
        # runs at an eighth of the rate of a multiply-add. w = (1 + q / 16) * 16 d s - (16 d s + dmin m).
        ds16 = (16.0 * d * scale)[:, :, :, None]
        q = (((codes >> (4 * half[:, :, :, None])) & 15) << 19 | 0x3F800000).to(tl.float32, bitcast=True)
        w = q * ds16 - (ds16 + (dmin * minimum)[:, :, :, None])
        w = tl.reshape(w, (BLOCK_N, 64 * PAIRS)).to(x_ptr.dtype.element_ty)
        xt = tl.load(x_rows + (p0 * 64 + ks)[:, None], mask=m_mask[None, :], other=0.0)
        acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION, out_dtype=tl.float32)
    store_split_output(acc, rows[None, :], cols[:, None], n_mask[:, None] & m_mask[None, :], out_ptr, stride_om,
                       work_ptr, counts_ptr, M, N, SPLITS, SPLIT)


@triton.jit
def _gemv_rows(w_ptr, xq_ptr, experts_ptr, expert_bytes, N, K, BLOCK_N: tl.constexpr, EXPERTS: tl.constexpr,
               X_ROW_DIV: tl.constexpr):
    """What an int8 GEMV program works on: W, its row of x's codes as int32 words, the index of that row's first
    run of 32, and its BLOCK_N rows of W with their mask. Output row program_id(0) takes x's row of the same
    index; where EXPERTS the output rows are (token, expert) pairs instead, W the pair's expert (experts_ptr[pair],
    expert_bytes apart) and x's row the pair's token (pair // X_ROW_DIV)."""
    pair = tl.program_id(0).to(tl.int64)
    if EXPERTS:
        w_ptr += tl.load(experts_ptr + pair).to(tl.int64) * expert_bytes
    x_row = pair // X_ROW_DIV
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return (w_ptr, xq_ptr.to(tl.pointer_type(tl.int32)) + x_row * (K // 4), x_row * (K // 32), rows,
            rows < N)


@triton.jit
def _q6_k_q8_gemv_kernel(xq_ptr, xd_ptr, w_ptr, out_ptr, work_ptr, counts_ptr, experts_ptr, expert_bytes,
                         M, N, K, row_halves, SPLIT_BLOCKS, SPLITS, stride_om,
                         BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT: tl.constexpr, DP4A: tl.constexpr,
                         EXPERTS: tl.constexpr, X_ROW_DIV: tl.constexpr):
    """x @ W^T for one row of x, quantized by _quantize_q8_kernel, and BLOCK_N rows of Q6_K W, BLOCK_B blocks a
    step. A 210-byte block is 2-byte aligned, so its words are read as pairs of 16-bit halves. Element
    128h + 32(2 p2 + p1) + 4i + b takes its low four bits from byte b of word 16h + 8p1 + i of ql (nibble p2)
    and its high two from byte b of word 8h + i of qh (bits 2(2 p2 + p1)): the tensors below are indexed
    [row, h, p2, p1, g, w] with i = 4g + w, so each ql word is read once for both its nibbles and a scale group
    of 16 elements is one (g) of them. The codes are unsigned (q + 32): a group's dot takes 32 times its sum of
    x back. Where SPLIT, program (.., .., s) takes SPLIT_BLOCKS blocks from block s * SPLIT_BLOCKS. EXPERTS and
    X_ROW_DIV as in _gemv_rows."""
    w_ptr, x_words, runs, rows, n_mask = _gemv_rows(w_ptr, xq_ptr, experts_ptr, expert_bytes, N, K, BLOCK_N,
                                                    EXPERTS, X_ROW_DIV)
    halves = w_ptr.to(tl.pointer_type(tl.uint16))
    row_base = (tl.where(n_mask, rows, 0).to(tl.int64) * row_halves)[:, None, None, None, None, None]
    two = tl.arange(0, 2)
    h = two[None, :, None, None, None, None]
    p2 = two[None, None, :, None, None, None]
    p1 = two[None, None, None, :, None, None]
    g = two[None, None, None, None, :, None]
    i = 4 * g + tl.arange(0, 4)[None, None, None, None, None, :]
    ql_at = 32 * h + 16 * p1 + 2 * i
    qh_at = 64 + 16 * h + 2 * i
    x_at = 32 * h + 16 * p2 + 8 * p1 + i
    group = (8 * h + 4 * p2 + 2 * p1 + g).reshape(1, 2, 2, 2, 2)
    run = group // 2
    acc = tl.zeros([BLOCK_N, 2, 2, 2, 2], dtype=tl.float32)
    b_begin = tl.program_id(2) * SPLIT_BLOCKS
    for b0 in range(b_begin, tl.minimum(K // 256, b_begin + SPLIT_BLOCKS), BLOCK_B):
        for bb in tl.static_range(BLOCK_B):
            blk = b0 + bb
            block = row_base + blk * 105
            ql = tl.load(halves + block + ql_at).to(tl.int32) | (tl.load(halves + block + ql_at + 1).to(tl.int32) << 16)
            qh = tl.load(halves + block + qh_at).to(tl.int32) | (tl.load(halves + block + qh_at + 1).to(tl.int32) << 16)
            codes = ((ql >> (4 * p2)) & 0x0F0F0F0F) | (((qh >> (4 * p2 + 2 * p1)) & 0x03030303) << 4)
            x = tl.load(x_words + blk * 64 + x_at)
            dot = tl.sum(dp4a(codes, x, DP4A), axis=5)
            x_sum = tl.sum(dp4a(tl.full(x.shape, 0x01010101, tl.int32), x, DP4A), axis=5)
            block_byte = (2 * block).reshape(BLOCK_N, 1, 1, 1, 1)
            scale = tl.load(w_ptr + block_byte + 192 + group).to(tl.int8, bitcast=True).to(tl.float32)
            d = tl.load(halves + block.reshape(BLOCK_N, 1, 1, 1, 1) + 104).to(tl.float16, bitcast=True)
            xd = tl.load(xd_ptr + runs + blk * 8 + run)
            acc += d.to(tl.float32) * scale * xd * (dot - 32 * x_sum).to(tl.float32)
    total = tl.sum(tl.sum(tl.sum(tl.sum(acc, axis=4), axis=3), axis=2), axis=1)
    store_split_output(total, tl.program_id(0), rows, n_mask, out_ptr, stride_om, work_ptr, counts_ptr, M, N, SPLITS,
                       SPLIT)


@triton.jit
def _k_scale_min_words(a, m, c, sub):
    """The 6-bit scales and mins of sub-blocks `sub` (in 0..7) from a Q4_K block's scale words a, m, c (bytes
    4-7, 8-11 and 12-15 of the block), as floats of their broadcast shape."""
    shift = 8 * (sub % 4)
    a_byte = (a >> shift) & 255
    m_byte = (m >> shift) & 255
    c_byte = (c >> shift) & 255
    scale = tl.where(sub < 4, a_byte & 63, (c_byte & 15) | ((a_byte >> 6) << 4))
    minimum = tl.where(sub < 4, m_byte & 63, (c_byte >> 4) | ((m_byte >> 6) << 4))
    return scale.to(tl.float32), minimum.to(tl.float32)


@functools.cache
def _levels(device: torch.device) -> torch.Tensor:
    # Made on the first (eager) call, before any CUDA graph capture.
    return torch.tensor(IQ4_LEVELS, dtype=torch.float32, device=device)


def _dequantized_stays_in_l2(weights: int, x: torch.Tensor) -> bool:
    """Whether W dequantized into x's dtype is small enough to stay in the L2 cache between the dequantizing
    kernel and cuBLAS (a quarter of it): then the copy costs little and cuBLAS beats the tile kernel."""
    if not x.is_cuda:
        return False
    return weights * x.element_size() <= torch.cuda.get_device_properties(x.device).L2_cache_size // 4


def _launch_int8_gemv(x: torch.Tensor, data: torch.Tensor, qtype: GGMLQuantizationType, out: torch.Tensor,
                      experts: torch.Tensor | None, x_row_div: int, gemv_config: tuple[int, int, int, int] | None,
                      split_k: int | None) -> None:
    """out [rows, N] = each row's x row @ W^T by the int8 GEMV of `qtype`; data [N, row bytes], or with `experts`
    (each output row's expert) [experts, N, row bytes], x's row then the output row // x_row_div."""
    kernel, default, row_unit, takes_sums = _int8_gemv(qtype, data)
    m, n = out.shape
    k = x.shape[1]
    block_n, block_b, warps, split_warps = gemv_config or default
    while (k // 256) % block_b:
        block_b //= 2
    xq, xd, xs = quantize_q8(x)
    grid = (m, triton.cdiv(n, block_n))
    split = SplitK(k // 256 // block_b, m * grid[1], warps, split_warps, out, split_k)
    kernel[(*grid, split.splits)](
        *((xq, xd, xs) if takes_sums else (xq, xd)), data, out, split.work, split.counts,
        out if experts is None else experts, 0 if experts is None else data.stride(0), m, n, k,
        data.stride(-2) // row_unit, split.steps * block_b, split.splits, out.stride(0), BLOCK_N=block_n,
        BLOCK_B=block_b, SPLIT=split.splits > 1, DP4A=DP4A, EXPERTS=experts is not None, X_ROW_DIV=x_row_div,
        num_warps=warps)


def _q4_k_tile_config(rows: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """The tile of Q4_K_TILE_CONFIGS for `rows` rows of x; float32 x takes at most 32 rows a tile (its tiles of x
    take twice the shared memory: 256 rows needed 305 KB on an H100, which has 227)."""
    block_m, block_n, pairs, warps, stages = next(c for bound, c in Q4_K_TILE_CONFIGS if rows <= bound)
    if dtype == torch.float32:
        block_m = min(block_m, 32)
    return block_m, block_n, pairs, warps, stages


def expert_tile_rows(num_pairs: int, num_experts: int, dtype: torch.dtype) -> int:
    """The row tile of gguf_expert_matmul for num_pairs (token, expert) pairs over num_experts experts and x of
    `dtype` (moe_align's block_m): the tile for the pairs an expert gets on average, at most 128."""
    return _q4_k_tile_config(min(128, -(-num_pairs // num_experts)), dtype)[0]


def gguf_expert_matmul(x: torch.Tensor, data: torch.Tensor, k: int, sorted_ids: torch.Tensor,
                       block_expert: torch.Tensor, num_padded: torch.Tensor, block_m: int, num_pairs: int,
                       x_row_div: int, split_k: int | None = None) -> torch.Tensor:
    """out [num_pairs, N]: row p = x[p // x_row_div] @ W_e^T for Q4_K experts `data` [E, N, row bytes] over k
    columns, each pair p in the tiles of moe_align(ids, E, block_m) (e = its expert); block_m from
    expert_tile_rows. split_k: the splits of K, for tests; None picks them."""
    if sorted_ids.numel() != block_expert.numel() * block_m:
        raise ValueError(f"the sorted pairs are not in tiles of {block_m} rows")
    n = data.shape[1]
    _, block_n, pairs, warps, stages = _q4_k_tile_config(block_m, x.dtype)
    x2 = x.reshape(-1, k).contiguous()
    out = torch.empty(num_pairs, n, dtype=x.dtype, device=x.device)
    grid = (block_expert.shape[0], triton.cdiv(n, block_n))
    split = SplitK(k // 64 // pairs, grid[0] * grid[1], warps, Q4_K_TILE_SPLIT_WARPS, out, split_k)
    _q4_k_tile_kernel[(*grid, split.splits)](
        x2, data, out, split.work, split.counts, sorted_ids, block_expert, num_padded, data.stride(0), num_pairs, n,
        k, x2.stride(0), data.stride(1) // 4, out.stride(0), split.steps * pairs, split.splits, BLOCK_M=block_m,
        BLOCK_N=block_n, PAIRS=pairs, SPLIT=split.splits > 1,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", SORTED=True, X_ROW_DIV=x_row_div,
        num_warps=warps, num_stages=stages)
    return out


def runs_expert_gemv(data: torch.Tensor, qtype: GGMLQuantizationType) -> bool:
    """Whether gguf_expert_gemv runs experts `data` [experts, N, row bytes] of `qtype`."""
    return data.is_cuda and data.is_contiguous() and _int8_gemv(qtype, data.view(-1, data.shape[-1])) is not None


def gguf_expert_gemv(x: torch.Tensor, data: torch.Tensor, qtype: GGMLQuantizationType, k: int,
                     experts: torch.Tensor, x_row_div: int) -> torch.Tensor:
    """out [P, N]: row p = x[p // x_row_div] @ W_{experts[p]}^T for experts `data` [E, N, row bytes] of `qtype` over
    k columns, where runs_expert_gemv(data, qtype)."""
    out = torch.empty(experts.numel(), data.shape[1], dtype=x.dtype, device=x.device)
    if out.shape[0]:
        _launch_int8_gemv(x.reshape(-1, k).contiguous(), data, qtype, out, experts, x_row_div, None, None)
    return out


def _int8_gemv(qtype: GGMLQuantizationType, data: torch.Tensor) -> tuple | None:
    """(kernel, default config, bytes of its unit of row stride, whether it takes x's run sums) of the int8 GEMV
    that runs `data`, or None."""
    if qtype == T.Q4_K and q4_k_words_ok(data):
        return _q4_k_q8_gemv_kernel, Q4_K_GEMV_CONFIG, 4, True
    if qtype == T.Q6_K and _halves_ok(data):
        return _q6_k_q8_gemv_kernel, Q6_K_GEMV_CONFIG, 2, False
    return None


def _halves_ok(data: torch.Tensor) -> bool:
    """Whether rows can be read as 16-bit halves (rows and their start 2-byte aligned)."""
    return data.stride(-1) == 1 and data.stride(0) % 2 == 0 and data.data_ptr() % 2 == 0


def q4_k_words_ok(data: torch.Tensor) -> bool:
    """Whether Q4_K rows can be read as int32 words (rows and their start 4-byte aligned)."""
    return data.stride(-1) == 1 and data.stride(0) % 4 == 0 and data.data_ptr() % 4 == 0


def gguf_matmul(x: torch.Tensor, data: torch.Tensor, qtype: GGMLQuantizationType,
                shape: tuple[int, int], gemv_config: tuple[int, int, int, int] | None = None,
                split_k: int | None = None, tile_config: tuple[int, int, int, int, int] | None = None,
                tile_max_rows: int | None = None) -> torch.Tensor:
    """x [..., K] @ W^T for W of `shape` (N, K) stored as `data` [N, row bytes] of `qtype` blocks.
    gemv_config: (rows, blocks a step, warps, warps an SM that splitting K aims at) of the Q4_K GEMV and
    split_k its splits of K (of either kernel); tile_config: (BLOCK_M, BLOCK_N, PAIRS, warps, stages) of the
    Q4_K tile kernel and tile_max_rows the most rows it takes; for benchmarks and tests, None picks them (no
    rows where W dequantized stays in the L2 cache)."""
    n, k = shape
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    q4_k_words = qtype == T.Q4_K and q4_k_words_ok(data)
    if tile_max_rows is None:
        tile_max_rows = 0 if _dequantized_stays_in_l2(n * k, x) else Q4_K_TILE_MAX_ROWS
    if m > GEMV_MAX_ROWS and not (q4_k_words and m <= tile_max_rows):
        return (x2 @ gguf_dequantize(data, qtype, shape, x.dtype).t()).reshape(*x.shape[:-1], n)
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*x.shape[:-1], n)
    if m > GEMV_MAX_ROWS:
        block_m, block_n, pairs, warps, stages = tile_config or _q4_k_tile_config(m, x.dtype)
        grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
        split = SplitK(k // 64 // pairs, grid[0] * grid[1], warps, Q4_K_TILE_SPLIT_WARPS, out, split_k)
        _q4_k_tile_kernel[(*grid, split.splits)](
            x2, data, out, split.work, split.counts, out, out, out, 0, m, n, k, x2.stride(0), data.stride(0) // 4,
            out.stride(0), split.steps * pairs, split.splits, BLOCK_M=block_m, BLOCK_N=block_n, PAIRS=pairs,
            SPLIT=split.splits > 1, DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", SORTED=False,
            X_ROW_DIV=1, num_warps=warps, num_stages=stages)
        return out.reshape(*x.shape[:-1], n)
    if _int8_gemv(qtype, data) is not None:
        _launch_int8_gemv(x2, data, qtype, out, None, 1, gemv_config, split_k)
        return out.reshape(*x.shape[:-1], n)
    block_n = 32 if block_size == 256 else 64
    _gguf_gemv_kernel[(m, triton.cdiv(n, block_n))](
        x2, data, _levels(x.device), out, n, x2.stride(0), data.stride(0), out.stride(0), k,
        QTYPE=_CODES[qtype], BS=block_size, TS=type_size, BLOCK_N=block_n)
    return out.reshape(*x.shape[:-1], n)
