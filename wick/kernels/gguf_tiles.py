"""GGUF weights against 9 to a few hundred rows of x: tiles of out^T = W x^T, each program decoding its tile of W
from the packed blocks in registers for tl.dot (W the wide operand, the rows of x the narrow one), so the packed
bytes are read once a tile of rows instead of W being decoded whole for cuBLAS. Every quantized type has a step
that decodes K_STEP columns of BLOCK_N rows at once, its codes put in float32 mantissas (no integer-to-float
conversions). Over (token, expert) pairs sorted by expert (moe_align's tiles) the same kernel runs packed experts
(a GGUF file's, or quantized in situ).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from wick.kernels.gemv_split import SplitK, store_split_output
from wick.kernels.gguf_int8_gemv import runs_int8_gemv
from wick.kernels.gguf_words import halves_word, iq4_level_bytes, k_scale_min_words, q4_k_head
from wick.kernels.int8_activations import DP4A

T = GGMLQuantizationType
# Rows of x up to which a dense layer of a type runs the tile kernel; past them W is dequantized whole for cuBLAS.
# Q8_0 decodes cheaply: its dense layers lost to the decoded path at 32 and 64 rows (0.64-0.66 against 0.49 ms,
# Llama-3.1-8B's four linears, H100), so only its experts run tiles.
# Q4_0 and Q4_1 decode cheaply too: with Q4_K's tiles (not swept) they were 0.31-0.53 ms at 16-64 rows from one
# run to the next against 0.43 decoded, so only their experts run tiles. Q5_0 and Q5_1 won at 16-256 rows in both
# runs (Q5_1: 0.59-0.72 against 0.85-0.93).
# Q2_K, IQ4_XS and IQ4_NL won over the decoded path in the median of six timings at most row counts from 16 to 128
# (IQ4_XS 0.26-0.51 against 0.57-0.59 ms; Q2_K lost at 16 rows, IQ4_NL at 32), each timing moving by up to 2x; Q2_K
# and IQ4_NL lost at 256 rows, IQ4_XS won there. Q3_K's tiles were a wash (0.42-0.48 against 0.46-0.47), so only its
# experts run tiles.
TILE_MAX_ROWS = {T.Q4_K: 256, T.Q5_K: 256, T.Q6_K: 128, T.Q5_0: 256, T.Q5_1: 256, T.Q2_K: 128, T.IQ4_XS: 256,
                 T.IQ4_NL: 128}
# (BLOCK_M, BLOCK_N, K_STEP (columns a step), warps, stages) of the tile kernel by the most rows they serve
# (benchmarks/kernels/bench_quant_gemm.py --sweep on an H100); past the last, the last.
TILE_CONFIGS: dict[GGMLQuantizationType, list[tuple[int, tuple[int, int, int, int, int]]]] = {
    T.Q4_K: [
        (16, (16, 64, 128, 4, 3)),
        (32, (32, 64, 128, 8, 3)),
        (64, (64, 128, 128, 8, 3)),
        (128, (128, 64, 128, 8, 3)),
        (1 << 62, (256, 64, 128, 8, 3)),
    ],
    T.Q6_K: [
        (16, (16, 64, 128, 4, 3)),
        (32, (32, 64, 128, 8, 3)),
        (64, (64, 64, 128, 8, 3)),
        (1 << 62, (128, 64, 128, 4, 3)),
    ],
}
# Q2_K, Q3_K, IQ4_XS and IQ4_NL (swept at 16, 64 and 256 rows) differ at 16 rows in the columns a step.
for _qtype, _k_step in ((T.Q2_K, 256), (T.Q3_K, 128), (T.IQ4_XS, 256), (T.IQ4_NL, 64)):
    TILE_CONFIGS[_qtype] = [
        (16, (16, 64, _k_step, 4, 3)),
        (32, (32, 64, 128, 4, 3)),
        (64, (64, 64, 128, 4, 3)),
        (128, (128, 64, 128, 4, 3)),
        (1 << 62, (256, 64, 128, 8, 3)),
    ]
# Q8_0's dense layers take no tiles unless forced (tile_max_rows); its tiles then take Q6_K's shapes. The others take
# Q4_K's.
TILE_CONFIGS[T.Q8_0] = TILE_CONFIGS[T.Q6_K]
for _qtype in (T.Q5_K, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1):
    TILE_CONFIGS[_qtype] = TILE_CONFIGS[T.Q4_K]
# The types whose steps read whole 128-column halves of a block.
HALF_BLOCK_TYPES = (T.Q2_K, T.Q3_K, T.Q6_K)
# The same over (token, expert) pairs sorted by expert, by the pairs an expert gets on average, for every type (an
# MoE layer's two GEMMs share one layout of sorted pairs). A row tile that holds all of an expert's pairs decodes
# its blocks once: at 16 pairs an expert on average 64-row tiles took 514 us against 693 with 128 rows and more
# with 16, at 128 the 128-row tile with 4 warps 1,072 against 1,468 with 8 (Qwen3-30B-A3B's experts, Q4_K gate/up
# and Q6_K down, H100).
EXPERT_TILE_CONFIGS = [
    (4, (16, 64, 128, 4, 3)),
    (32, (64, 64, 128, 4, 2)),
    (1 << 62, (128, 64, 128, 4, 3)),
]
# Warps an SM that splitting K of the tile kernel aims at.
TILE_SPLIT_WARPS = 16


@triton.jit
def _k_step(w_ptr, row_base, c0, BLOCK_N: tl.constexpr, K_STEP: tl.constexpr, FIFTH_BIT: tl.constexpr):
    """Q4_K W's (Q5_K's where FIFTH_BIT) columns c0 .. c0 + K_STEP (64, 128 or 256, within one block) of rows at
    byte offsets row_base, as float32 [BLOCK_N, K_STEP]. Byte 32p + l of a block's low four bits holds element
    64p + l in its low nibble and 64p + 32 + l in its high one; the codes are read as [BLOCK_N, PAIRS, 2, 32] (each
    byte twice, once a nibble) so that the tile comes out in column order. Q5_K's fifth bit of element 32s + l is
    bit s of byte l of its 32 fifth-bit bytes."""
    PAIRS: tl.constexpr = K_STEP // 64
    BLOCK_BYTES: tl.constexpr = 176 if FIFTH_BIT else 144
    LOW_BITS: tl.constexpr = 48 if FIFTH_BIT else 16
    LEVELS: tl.constexpr = 32 if FIFTH_BIT else 16
    SHIFT: tl.constexpr = 18 if FIFTH_BIT else 19  # q in the mantissa's top 5 or 4 bits
    words = w_ptr.to(tl.pointer_type(tl.int32))
    block = row_base // 4 + (c0 // 256) * (BLOCK_BYTES // 4)
    p0 = (c0 % 256) // 64
    p = tl.arange(0, PAIRS)[None, :, None]
    half = tl.arange(0, 2)[None, None, :]
    lane = tl.arange(0, 32)[None, None, None, :]
    d, dmin, a, m, c = q4_k_head(words, block)
    d, dmin = d[:, None, None], dmin[:, None, None]
    sub = 2 * (p0 + p) + half
    scale, minimum = k_scale_min_words(a[:, None, None], m[:, None, None], c[:, None, None], sub)
    codes = tl.load((w_ptr + block * 4 + LOW_BITS + p0 * 32)[:, None, None, None] + 32 * p[:, :, :, None] + lane)
    q = (codes.to(tl.int32) >> (4 * half[:, :, :, None])) & 15
    if FIFTH_BIT:
        fifth = tl.load((w_ptr + block * 4 + 16)[:, None, None, None] + lane).to(tl.int32)
        q |= ((fifth >> sub[:, :, :, None]) & 1) << 4
    # A code q in the float32 mantissa's top bits reads 1 + q / LEVELS: no integer-to-float conversion, which runs
    # at an eighth of the rate of a multiply-add. w = (1 + q / LEVELS) * LEVELS d s - (LEVELS d s + dmin m).
    ds = (LEVELS * d * scale)[:, :, :, None]
    q = (q << SHIFT | 0x3F800000).to(tl.float32, bitcast=True)
    return tl.reshape(q * ds - (ds + (dmin * minimum)[:, :, :, None]), (BLOCK_N, K_STEP))


@triton.jit
def _q6_k_step(w_ptr, row_base, c0, BLOCK_N: tl.constexpr, K_STEP: tl.constexpr):
    """Q6_K W's columns c0 .. c0 + K_STEP (128 or 256, within one block) of rows at byte offsets row_base, as
    float32 [BLOCK_N, K_STEP]. A block (210 bytes: ql[128], qh[64], 16 int8 scales, fp16 d) holds two halves of
    128; element 64 hi + 32 lo + l of half h has its low 4 bits in nibble hi of ql[64 h + 32 lo + l], its high 2
    in bits 2 (2 hi + lo) of qh[32 h + l], and scale 8 h + 2 (2 hi + lo) + l // 16. The tile is decoded as
    [BLOCK_N, HALVES, hi, lo, l // 16, l % 16], column order."""
    HALVES: tl.constexpr = K_STEP // 128
    block = (row_base + (c0 // 256) * 210)[:, None, None, None, None, None]
    h = (c0 % 256) // 128 + tl.arange(0, HALVES)[None, :, None, None, None, None]
    hi = tl.arange(0, 2)[None, None, :, None, None, None]
    lo = tl.arange(0, 2)[None, None, None, :, None, None]
    s = tl.arange(0, 2)[None, None, None, None, :, None]
    lane = 16 * s + tl.arange(0, 16)[None, None, None, None, None, :]
    ql = tl.load(w_ptr + block + 64 * h + 32 * lo + lane).to(tl.int32)
    qh = tl.load(w_ptr + block + 128 + 32 * h + lane).to(tl.int32)
    scale = tl.load((w_ptr + block + 192 + 8 * h + 2 * (2 * hi + lo) + s).to(tl.pointer_type(tl.int8)))
    d = tl.load((w_ptr + block + 208).to(tl.pointer_type(tl.float16))).to(tl.float32)
    code = ((ql >> (4 * hi)) & 15) | (((qh >> (2 * (2 * hi + lo))) & 3) << 4)
    # As in _k_step: 1 + q / 64 from the mantissa, w = d s (q - 32) = (1 + q / 64) * 64 d s - 96 d s.
    ds64 = 64.0 * d * scale.to(tl.float32)
    q = (code << 17 | 0x3F800000).to(tl.float32, bitcast=True)
    return tl.reshape(q * ds64 - 1.5 * ds64, (BLOCK_N, K_STEP))


@triton.jit
def _q8_0_step(w_ptr, row_base, c0, BLOCK_N: tl.constexpr, K_STEP: tl.constexpr):
    """Q8_0 W's columns c0 .. c0 + K_STEP (whole 32-value blocks of 34 bytes: fp16 d, 32 int8 codes) of rows at byte
    offsets row_base, as float32 [BLOCK_N, K_STEP]."""
    block = (row_base + (c0 // 32) * 34)[:, None, None] + 34 * tl.arange(0, K_STEP // 32)[None, :, None]
    codes = tl.load(w_ptr + block + 2 + tl.arange(0, 32)[None, None, :]).to(tl.int32)
    d = tl.load((w_ptr + block).to(tl.pointer_type(tl.float16))).to(tl.float32)
    # As in _k_step: q + 128 (the sign bit flipped) in the mantissa reads 1 + (q + 128) / 256, and
    # w = d q = (1 + (q + 128) / 256) * 256 d - 384 d.
    d256 = 256.0 * d
    q = ((codes ^ 0x80) << 15 | 0x3F800000).to(tl.float32, bitcast=True)
    return tl.reshape(q * d256 - 1.5 * d256, (BLOCK_N, K_STEP))


@triton.jit
def _q4_q5_step(w_ptr, row_base, c0, BLOCK_N: tl.constexpr, K_STEP: tl.constexpr, TS: tl.constexpr,
                HAS_MIN: tl.constexpr, FIFTH_BIT: tl.constexpr):
    """Q4_0 W's columns c0 .. c0 + K_STEP (whole 32-value blocks of TS bytes) of rows at byte offsets row_base, as
    float32 [BLOCK_N, K_STEP]; Q4_1 where HAS_MIN, Q5_0 where FIFTH_BIT, Q5_1 where both (as gguf_int8_gemv's
    _q4_q5_q8_gemv_kernel reads them). Byte l of a block's 16 bytes of codes holds element l in its
    low nibble and 16 + l in its high one: the codes are read as [BLOCK_N, blocks, 2, 16], each byte twice, so the
    tile comes out in column order; element e's fifth bit is bit e % 8 of byte e // 8 of the fifth-bit word."""
    NB: tl.constexpr = K_STEP // 32
    block = (row_base + (c0 // 32) * TS)[:, None, None, None] + TS * tl.arange(0, NB)[None, :, None, None]
    half = tl.arange(0, 2)[None, None, :, None]
    lane = tl.arange(0, 16)[None, None, None, :]
    codes = tl.load(w_ptr + block + TS - 16 + lane).to(tl.int32)
    q = (codes >> (4 * half)) & 15
    if FIFTH_BIT:
        fifth = tl.load(w_ptr + block + (4 if HAS_MIN else 2) + 2 * half + lane // 8).to(tl.int32)
        q |= ((fifth >> (lane % 8)) & 1) << 4
    # As in _k_step: 1 + q / N from the mantissa (N = 32 with a fifth bit, else 16): w = d q + m =
    # (1 + q / N) N d - N d + m, and without m w = d (q - N / 2) = (1 + q / N) N d - 1.5 N d.
    n_levels: tl.constexpr = 32.0 if FIFTH_BIT else 16.0
    dn = n_levels * tl.load((w_ptr + block).to(tl.pointer_type(tl.float16))).to(tl.float32)
    f = (q << (18 if FIFTH_BIT else 19) | 0x3F800000).to(tl.float32, bitcast=True)
    if HAS_MIN:
        w = f * dn - dn + tl.load((w_ptr + block + 2).to(tl.pointer_type(tl.float16))).to(tl.float32)
    else:
        w = f * dn - 1.5 * dn
    return tl.reshape(w, (BLOCK_N, K_STEP))


@triton.jit
def _q2_q3_k_step(w_ptr, row_base, c0, BLOCK_N: tl.constexpr, K_STEP: tl.constexpr, Q2_K: tl.constexpr):
    """Q3_K W's (Q2_K's where Q2_K) columns c0 .. c0 + K_STEP (128 or 256, within one block) of rows at byte offsets
    row_base, as float32 [BLOCK_N, K_STEP]. Element 128h + 32p + l of a block (as gguf_int8_gemv's
    _q2_q3_k_q8_gemv_kernel reads it) takes its low two bits from bits 2p of qs[32h + l], in Q3_K its third from bit
    4h + p of hmask[l], and scale 8h + 2p + l // 16; the tile is decoded as [BLOCK_N, HALVES, p, l // 16, l % 16],
    column order."""
    HALVES: tl.constexpr = K_STEP // 128
    block = (row_base + (c0 // 256) * (84 if Q2_K else 110))[:, None, None, None, None]
    h = (c0 % 256) // 128 + tl.arange(0, HALVES)[None, :, None, None, None]
    p = tl.arange(0, 4)[None, None, :, None, None]
    g = tl.arange(0, 2)[None, None, None, :, None]
    lane = 16 * g + tl.arange(0, 16)[None, None, None, None, :]
    sub = 8 * h + 2 * p + g
    qs = tl.load(w_ptr + block + (16 if Q2_K else 32) + 32 * h + lane).to(tl.int32)
    q = (qs >> (2 * p)) & 3
    if Q2_K:
        # As in _k_step: 1 + q / 4 from the mantissa, w = d sc q - dmin m = (1 + q / 4) 4 d sc - 4 d sc - dmin m.
        scale_min = tl.load(w_ptr + block + sub).to(tl.int32)
        d = tl.load((w_ptr + block + 80).to(tl.pointer_type(tl.float16))).to(tl.float32)
        dmin = tl.load((w_ptr + block + 82).to(tl.pointer_type(tl.float16))).to(tl.float32)
        ds4 = 4.0 * d * (scale_min & 15).to(tl.float32)
        f = (q << 21 | 0x3F800000).to(tl.float32, bitcast=True)
        w = f * ds4 - (ds4 + dmin * (scale_min >> 4).to(tl.float32))
    else:
        hmask = tl.load(w_ptr + block + lane).to(tl.int32)
        q |= ((hmask >> (4 * h + p)) & 1) << 2
        low4 = (tl.load(w_ptr + block + 96 + sub % 8).to(tl.int32) >> (4 * (sub // 8))) & 15
        high2 = (tl.load(w_ptr + block + 104 + sub % 4).to(tl.int32) >> (2 * (sub // 4))) & 3
        d = tl.load((w_ptr + block + 108).to(tl.pointer_type(tl.float16))).to(tl.float32)
        # w = d s (q - 4) = (1 + q / 8) 8 d s - 12 d s
        ds8 = 8.0 * d * ((low4 | (high2 << 4)) - 32).to(tl.float32)
        f = (q << 20 | 0x3F800000).to(tl.float32, bitcast=True)
        w = f * ds8 - 1.5 * ds8
    return tl.reshape(w, (BLOCK_N, K_STEP))


@triton.jit
def _iq4_tile(codes, d, BLOCK_N: tl.constexpr, K_STEP: tl.constexpr, DP4A: tl.constexpr):
    """float32 [BLOCK_N, K_STEP] of 32-value IQ4 runs: `codes` [BLOCK_N, runs, 1, 4, 1] their four int32 words of
    codes (byte b of word i holds element 4i + b in its low nibble and 16 + 4i + b in its high one), `d` [BLOCK_N,
    runs, 1, 1, 1] their scales; w = d IQ4_LEVELS[q]. Each code becomes its level's signed byte by
    gguf_int8_gemv's byte permutes, four at a time."""
    half = tl.arange(0, 2)[None, None, :, None, None]
    b = tl.arange(0, 4)[None, None, None, None, :]
    levels = iq4_level_bytes((codes >> (4 * half)) & 0x0F0F0F0F, DP4A)
    # As in _q8_0_step: the level + 128 (the sign bit flipped) in the mantissa reads 1 + (level + 128) / 256.
    f = ((((levels >> (8 * b)) ^ 0x80) & 255) << 15 | 0x3F800000).to(tl.float32, bitcast=True)
    d256 = 256.0 * d
    return tl.reshape(f * d256 - 1.5 * d256, (BLOCK_N, K_STEP))


@triton.jit
def _iq4_xs_step(w_ptr, row_base, c0, BLOCK_N: tl.constexpr, K_STEP: tl.constexpr, DP4A: tl.constexpr):
    """IQ4_XS W's columns c0 .. c0 + K_STEP (within one block) of rows at byte offsets row_base, as float32
    [BLOCK_N, K_STEP]. A 136-byte block's words (as gguf_int8_gemv's _iq4_xs_q8_gemv_kernel reads them): word 0
    holds fp16 d and the 2-bit high parts of the eight 6-bit scales, word 1 their low nibbles, then run s is words
    2 + 4s .. 5 + 4s."""
    RUNS: tl.constexpr = K_STEP // 32
    words = w_ptr.to(tl.pointer_type(tl.int32))
    block = (row_base // 4 + (c0 // 256) * 34)[:, None, None, None, None]
    s = (c0 % 256) // 32 + tl.arange(0, RUNS)[None, :, None, None, None]
    i = tl.arange(0, 4)[None, None, None, :, None]
    codes = tl.load(words + block + 2 + 4 * s + i)
    head = tl.load(words + block)
    d = (head & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    low4 = (tl.load(words + block + 1) >> (4 * s)) & 15
    high2 = (head >> (16 + 2 * s)) & 3
    return _iq4_tile(codes, d * ((low4 | (high2 << 4)) - 32).to(tl.float32), BLOCK_N, K_STEP, DP4A)


@triton.jit
def _iq4_nl_step(w_ptr, row_base, c0, BLOCK_N: tl.constexpr, K_STEP: tl.constexpr, DP4A: tl.constexpr):
    """IQ4_NL W's columns c0 .. c0 + K_STEP (whole 18-byte blocks: fp16 d, Q4_0's 16 bytes of codes) of rows at
    byte offsets row_base, as float32 [BLOCK_N, K_STEP]; the blocks are 2-byte aligned, their words read as pairs
    of 16-bit halves."""
    halves = w_ptr.to(tl.pointer_type(tl.uint16))
    block = (row_base // 2 + (c0 // 32) * 9)[:, None, None, None, None] + 9 * tl.arange(0, K_STEP // 32)[
        None, :, None, None, None]
    codes = halves_word(halves, block + 1 + 2 * tl.arange(0, 4)[None, None, None, :, None])
    d = tl.load(halves + block).to(tl.float16, bitcast=True).to(tl.float32)
    return _iq4_tile(codes, d, BLOCK_N, K_STEP, DP4A)


@triton.jit(do_not_specialize=["M"])
def _tile_kernel(x_ptr, w_ptr, out_ptr, work_ptr, counts_ptr, sorted_ptr, experts_ptr, padded_ptr,
                 expert_bytes, M, N, K, stride_xm, row_bytes, stride_om, SPLIT_STEPS, SPLITS,
                 QTYPE: tl.constexpr, TS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 K_STEP: tl.constexpr, SPLIT: tl.constexpr, DOT_PRECISION: tl.constexpr, SORTED: tl.constexpr,
                 X_ROW_DIV: tl.constexpr, DP4A: tl.constexpr):
    """out^T tile [BLOCK_N, BLOCK_M] = W tile @ x^T for W in GGUF type QTYPE (blocks of TS bytes), K_STEP columns a
    step, each type by its step; DP4A: the byte permutes of IQ4's steps run as PTX. Where SPLIT, program (.., .., s)
    takes SPLIT_STEPS steps from step s * SPLIT_STEPS (gemv_split.py). SORTED: the output rows are M (token, expert)
    pairs, tile i's the sorted pairs sorted_ptr[i * BLOCK_M + ...] of expert experts_ptr[i] (moe_align's layout, M
    for padding; tiles from padded_ptr[0] / BLOCK_M on have none), W that expert's (expert_bytes apart) and x's row
    a pair's token (pair // X_ROW_DIV)."""
    if SORTED:
        if tl.program_id(0) * BLOCK_M >= tl.load(padded_ptr):
            return
        rows = tl.load(sorted_ptr + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        w_ptr += tl.load(experts_ptr + tl.program_id(0)).to(tl.int64) * expert_bytes
    else:
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    m_mask = rows < M
    # Rows of W past N read row 0 and are not stored.
    row_base = tl.where(n_mask, cols, 0).to(tl.int64) * row_bytes
    ks = tl.arange(0, K_STEP)
    x_rows = x_ptr + (tl.where(m_mask, rows, 0) // X_ROW_DIV).to(tl.int64)[None, :] * stride_xm
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    c_begin = tl.program_id(2) * SPLIT_STEPS * K_STEP
    for c0 in range(c_begin, tl.minimum(K, c_begin + SPLIT_STEPS * K_STEP), K_STEP):
        if QTYPE == "Q4_K" or QTYPE == "Q5_K":
            w = _k_step(w_ptr, row_base, c0, BLOCK_N, K_STEP, QTYPE == "Q5_K")
        elif QTYPE == "Q6_K":
            w = _q6_k_step(w_ptr, row_base, c0, BLOCK_N, K_STEP)
        elif QTYPE == "Q8_0":
            w = _q8_0_step(w_ptr, row_base, c0, BLOCK_N, K_STEP)
        elif QTYPE == "Q4_0" or QTYPE == "Q4_1" or QTYPE == "Q5_0" or QTYPE == "Q5_1":
            w = _q4_q5_step(w_ptr, row_base, c0, BLOCK_N, K_STEP, TS, QTYPE == "Q4_1" or QTYPE == "Q5_1",
                            QTYPE == "Q5_0" or QTYPE == "Q5_1")
        elif QTYPE == "Q2_K" or QTYPE == "Q3_K":
            w = _q2_q3_k_step(w_ptr, row_base, c0, BLOCK_N, K_STEP, QTYPE == "Q2_K")
        elif QTYPE == "IQ4_XS":
            w = _iq4_xs_step(w_ptr, row_base, c0, BLOCK_N, K_STEP, DP4A)
        else:
            w = _iq4_nl_step(w_ptr, row_base, c0, BLOCK_N, K_STEP, DP4A)
        xt = tl.load(x_rows + (c0 + ks)[:, None], mask=m_mask[None, :], other=0.0)
        acc = tl.dot(w.to(x_ptr.dtype.element_ty), xt, acc, input_precision=DOT_PRECISION, out_dtype=tl.float32)
    store_split_output(acc, rows[None, :], cols[:, None], n_mask[:, None] & m_mask[None, :], out_ptr, stride_om,
                       work_ptr, counts_ptr, M, N, SPLITS, SPLIT)


def runs_tiles(qtype: GGMLQuantizationType, data: torch.Tensor) -> bool:
    """Whether the tile kernel can run W `data` [N, row bytes] of `qtype`: where its rows are aligned as the int8
    GEMVs need."""
    return runs_int8_gemv(qtype, data)


def runs_expert_tiles(data: torch.Tensor, qtype: GGMLQuantizationType) -> bool:
    """Whether gguf_expert_matmul runs experts `data` [experts, N, row bytes] of `qtype` (runs_tiles)."""
    return data.is_contiguous() and runs_tiles(qtype, data.view(-1, data.shape[-1]))


def _tile_config(configs: list[tuple[int, tuple[int, int, int, int, int]]], rows: int,
                 dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """The tile of `configs` for `rows` rows; float32 x takes at most 32 rows a tile (its tiles of x take twice the
    shared memory: 256 rows of Q4_K needed 305 KB on an H100, which has 227)."""
    block_m, block_n, k_step, warps, stages = next(c for bound, c in configs if rows <= bound)
    if dtype == torch.float32:
        block_m = min(block_m, 32)
    return block_m, block_n, k_step, warps, stages


def expert_tile_config(num_pairs: int, num_experts: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """The tile of gguf_expert_matmul for num_pairs (token, expert) pairs over num_experts experts and x of `dtype`;
    its BLOCK_M is moe_align's block_m."""
    return _tile_config(EXPERT_TILE_CONFIGS, -(-num_pairs // num_experts), dtype)


def gguf_expert_matmul(x: torch.Tensor, data: torch.Tensor, qtype: GGMLQuantizationType, k: int,
                       sorted_ids: torch.Tensor, block_expert: torch.Tensor, num_padded: torch.Tensor,
                       config: tuple[int, int, int, int, int], num_pairs: int, x_row_div: int,
                       split_k: int | None = None) -> torch.Tensor:
    """out [num_pairs, N]: row p = x[p // x_row_div] @ W_e^T for experts `data` [E, N, row bytes] of `qtype`
    over k columns, each pair p in the tiles of moe_align(ids, E, config[0]) (e = its expert); config from
    expert_tile_config. split_k: the splits of K, for tests; None picks them."""
    if sorted_ids.numel() != block_expert.numel() * config[0]:
        raise ValueError(f"the sorted pairs are not in tiles of {config[0]} rows")
    out = torch.empty(num_pairs, data.shape[1], dtype=x.dtype, device=x.device)
    _launch(x.reshape(-1, k).contiguous(), data, qtype, out, config, split_k, (sorted_ids, block_expert, num_padded),
            x_row_div)
    return out


def tile_matmul(x: torch.Tensor, data: torch.Tensor, qtype: GGMLQuantizationType, out: torch.Tensor,
                tile_config: tuple[int, int, int, int, int] | None, split_k: int | None) -> None:
    """out [M, N] = x [M, K] @ W^T for W `data` [N, row bytes] of `qtype`, where runs_tiles. tile_config:
    (BLOCK_M, BLOCK_N, K_STEP, warps, stages) and split_k the splits of K, for benchmarks and tests; None picks
    them."""
    _launch(x, data, qtype, out, tile_config or _tile_config(TILE_CONFIGS[qtype], x.shape[0], x.dtype), split_k, None,
            1)


def _launch(x: torch.Tensor, data: torch.Tensor, qtype: GGMLQuantizationType, out: torch.Tensor,
            config: tuple[int, int, int, int, int], split_k: int | None,
            sorted_pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None, x_row_div: int) -> None:
    """The tile kernel over out's rows, or with sorted_pairs (moe_align's sorted ids, each tile's expert, the rows
    in use) over (token, expert) pairs of experts `data` [E, N, row bytes]."""
    block_m, block_n, k_step, warps, stages = config
    if 256 % k_step or k_step < (128 if qtype in HALF_BLOCK_TYPES else 64):
        raise ValueError(f"{qtype.name} tiles take 64 (not Q2_K, Q3_K, Q6_K), 128 or 256 columns a step, not {k_step}")
    if x.shape[1] % k_step:
        raise ValueError(f"tiles of {k_step} columns a step do not cover rows of {x.shape[1]} columns")
    m, n = out.shape
    k = x.shape[1]
    grid = (triton.cdiv(m, block_m) if sorted_pairs is None else sorted_pairs[1].shape[0], triton.cdiv(n, block_n))
    split = SplitK(k // k_step, grid[0] * grid[1], warps, TILE_SPLIT_WARPS, out, split_k)
    _tile_kernel[(*grid, split.splits)](
        x, data, out, split.work, split.counts, *(sorted_pairs or (out, out, out)),
        0 if sorted_pairs is None else data.stride(0), m, n, k, x.stride(0), data.stride(-2), out.stride(0),
        split.steps, split.splits, QTYPE=qtype.name, TS=GGML_QUANT_SIZES[qtype][1], BLOCK_M=block_m,
        BLOCK_N=block_n, K_STEP=k_step, SPLIT=split.splits > 1,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", SORTED=sorted_pairs is not None,
        X_ROW_DIV=x_row_div, DP4A=DP4A, num_warps=warps, num_stages=stages)
