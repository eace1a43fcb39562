"""The int8 GEMVs of GGUF's types of 256-value super-blocks (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS), the kernels that
gguf_int8_gemv.py launches for them: x rounded to int8 in runs of 32 meets four weight codes at a time in dp4a, each
sub-block's integer sum taking its scales once. Q4_K has a second form whose blocks come by the tensor memory
accelerator (Hopper on)."""

from __future__ import annotations

import triton
import triton.language as tl

from wick.kernels.gemv_split import store_split_output
from wick.kernels.gguf_words import halves_word, iq4_level_bytes, k_scale_min_words, q4_k_d_dmin, q4_k_head
from wick.kernels.int8_activations import dp4a, dp4a_signed
from wick.kernels.pdl import pdl_prologue


@triton.jit
def gemv_rows(w_ptr, xq_ptr, experts_ptr, expert_bytes, N, K, BLOCK_N: tl.constexpr, EXPERTS: tl.constexpr,
              X_ROW_DIV: tl.constexpr, PDL: tl.constexpr):
    """What an int8 GEMV program works on: W, its row of x's codes as int32 words, the index of that row's first
    run of 32, and its BLOCK_N rows of W with their mask. Output row program_id(0) takes x's row of the same
    index; where EXPERTS the output rows are (token, expert) pairs instead, W the pair's expert (experts_ptr[pair],
    expert_bytes apart) and x's row the pair's token (pair // X_ROW_DIV). Where PDL (pdl.py) the kernel lets its
    successor launch and waits for x's codes (and the experts' ids) first."""
    pdl_prologue(PDL)
    pair = tl.program_id(0).to(tl.int64)
    if EXPERTS:
        w_ptr += tl.load(experts_ptr + pair).to(tl.int64) * expert_bytes
    x_row = pair // X_ROW_DIV
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return (w_ptr, xq_ptr.to(tl.pointer_type(tl.int32)) + x_row * (K // 4), x_row * (K // 32), rows,
            rows < N)



@triton.jit
def _q4_k_pair_sums(d, dmin, a, m, c, low_sub, dot_low, dot_high, xd_ptr, xs_ptr, run):
    """A Q4_K block's sums over its sub-block pairs: the integer dots of sub-blocks low_sub (even) and low_sub + 1
    against x's runs `run` and run + 1 (their d and d * sum(codes) at xd_ptr and xs_ptr), each taking its 6-bit
    scale and minimum (from the scale words a, m, c) and the block's d and dmin."""
    scale_low, min_low = k_scale_min_words(a, m, c, low_sub)
    scale_high, min_high = k_scale_min_words(a, m, c, low_sub + 1)
    return (d * (scale_low * tl.load(xd_ptr + run) * dot_low + scale_high * tl.load(xd_ptr + run + 1) * dot_high)
            - dmin * (min_low * tl.load(xs_ptr + run) + min_high * tl.load(xs_ptr + run + 1)))


@triton.jit
def _k_q8_gemv_kernel(xq_ptr, xd_ptr, xs_ptr, w_ptr, out_ptr, work_ptr, counts_ptr, experts_ptr, expert_bytes,
                      M, N, K, row_words, SPLIT_BLOCKS, SPLITS, stride_om,
                      BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT: tl.constexpr, DP4A: tl.constexpr,
                      EXPERTS: tl.constexpr, X_ROW_DIV: tl.constexpr, FIFTH_BIT: tl.constexpr, PDL: tl.constexpr):
    """x @ W^T for one row of x, quantized by _quantize_q8_kernel, and BLOCK_N rows of Q4_K W (Q5_K where
    FIFTH_BIT), BLOCK_B blocks a step; the blocks read as int32 words (0: d, dmin; 1-3: the scales; Q5_K's 4-11:
    the fifth bits; then the low four bits in 32 words). Low-bits word 8j + i holds in byte b the elements
    64j + 4i + b (low nibble, sub-block 2j) and 64j + 32 + 4i + b (high nibble, sub-block 2j + 1): four
    consecutive elements of x, one int32 word of its int8 codes, so each nibble plane of a word meets x in one
    dp4a. Q5_K's fifth bits of the elements 32s + 4i + b are bit s of byte b of its fifth-bit word i, so one word
    a step serves all eight sub-blocks. A sub-block's integer sum then takes its scales once. Where SPLIT,
    program (.., .., s) takes SPLIT_BLOCKS blocks from block s * SPLIT_BLOCKS (gemv_split.py). EXPERTS and
    X_ROW_DIV as in gemv_rows."""
    w_ptr, x_words, runs, rows, n_mask = gemv_rows(w_ptr, xq_ptr, experts_ptr, expert_bytes, N, K, BLOCK_N,
                                                   EXPERTS, X_ROW_DIV, PDL)
    words = w_ptr.to(tl.pointer_type(tl.int32))
    block_words: tl.constexpr = 44 if FIFTH_BIT else 36
    low_bits: tl.constexpr = 12 if FIFTH_BIT else 4
    row_base = tl.where(n_mask, rows, 0).to(tl.int64) * row_words
    j = tl.arange(0, 4)
    i = tl.arange(0, 8)
    low_sub = 2 * j[None, :]
    acc = tl.zeros([BLOCK_N, 4], dtype=tl.float32)
    b_begin = tl.program_id(2) * SPLIT_BLOCKS
    for b0 in range(b_begin, tl.minimum(K // 256, b_begin + SPLIT_BLOCKS), BLOCK_B):
        for bb in tl.static_range(BLOCK_B):
            blk = b0 + bb
            block = row_base + blk * block_words
            d, dmin, a, m, c = q4_k_head(words, block)
            a, m, c = a[:, None], m[:, None], c[:, None]
            codes = tl.load(words + block[:, None, None] + low_bits + 8 * j[None, :, None] + i[None, None, :])
            codes_low = codes & 0x0F0F0F0F
            codes_high = (codes >> 4) & 0x0F0F0F0F
            if FIFTH_BIT:
                fifth = tl.load(words + block[:, None, None] + 4 + i[None, None, :])
                codes_low |= ((fifth >> (2 * j[None, :, None])) & 0x01010101) << 4
                codes_high |= ((fifth >> (2 * j[None, :, None] + 1)) & 0x01010101) << 4
            # Q5_K reads x's words in the codes' layout, a copy a row: its loop gains (97.4-97.7 -> 77.3-77.7 us
            # over Llama-3.1-8B's layers on an H200), Q4_K's does not (70.0 -> 73.0)
            if FIFTH_BIT:
                x_at = x_words + blk * 64 + 16 * j[None, :, None] + i[None, None, :] + 0 * rows[:, None, None]
                x_low, x_high = tl.load(x_at), tl.load(x_at + 8)
            else:
                x_at = x_words + blk * 64 + 16 * j[:, None] + i[None, :]
                x_low, x_high = tl.load(x_at)[None, :, :], tl.load(x_at + 8)[None, :, :]
            dot_low = tl.sum(dp4a(codes_low, x_low, DP4A), axis=2).to(tl.float32)
            dot_high = tl.sum(dp4a(codes_high, x_high, DP4A), axis=2).to(tl.float32)
            acc += _q4_k_pair_sums(d[:, None], dmin[:, None], a, m, c, low_sub, dot_low, dot_high, xd_ptr, xs_ptr,
                                   (runs + blk * 8 + 2 * j)[None, :])
    store_split_output(tl.sum(acc, axis=1), tl.program_id(0), rows, n_mask, out_ptr, stride_om, work_ptr,
                       counts_ptr, M, N, SPLITS, SPLIT)


@triton.jit
def _q4_k_q8_tma_gemv_kernel(xq_ptr, xd_ptr, xs_ptr, head_desc, codes_desc, out_ptr, work_ptr, counts_ptr,
                             experts_ptr, M, N, K, SPLIT_BLOCKS, SPLITS, stride_om,
                             BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT: tl.constexpr, DP4A: tl.constexpr,
                             EXPERTS: tl.constexpr, X_ROW_DIV: tl.constexpr, STAGES: tl.constexpr,
                             PDL: tl.constexpr):
    """_k_q8_gemv_kernel's Q4_K product with W's blocks brought by the tensor memory accelerator, STAGES steps of
    [BLOCK_N rows, BLOCK_B blocks] in flight: the descriptors view W as [rows, blocks, 36 words] and take a step's
    heads (words 0-3) and low bits (4-35) as two tiles. With EXPERTS, W's rows are the experts' one after another
    and a pair's rows start at its expert's."""
    pdl_prologue(PDL)
    pair = tl.program_id(0).to(tl.int64)
    rows = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    w_row = tl.program_id(1) * BLOCK_N  # the descriptors' first row: of the pair's expert's, with EXPERTS
    if EXPERTS:
        w_row += tl.load(experts_ptr + pair).to(tl.int32) * N
    x_row = pair // X_ROW_DIV
    x_words = xq_ptr.to(tl.pointer_type(tl.int32)) + x_row * (K // 4)
    step = tl.arange(0, BLOCK_B)
    j = tl.arange(0, 4)
    i = tl.arange(0, 8)
    low_sub = 2 * j[None, None, :]
    acc = tl.zeros([BLOCK_N, BLOCK_B, 4], dtype=tl.float32)
    b_begin = tl.program_id(2) * SPLIT_BLOCKS
    for b0 in tl.range(b_begin, tl.minimum(K // 256, b_begin + SPLIT_BLOCKS), BLOCK_B, num_stages=STAGES):
        head = head_desc.load([w_row, b0, 0]).reshape(BLOCK_N, BLOCK_B, 2, 2)
        codes = codes_desc.load([w_row, b0, 4]).reshape(BLOCK_N, BLOCK_B, 4, 8)
        words_0_2, words_1_3 = head.split()
        d_dmin, m = words_0_2.split()
        a, c = words_1_3.split()
        d, dmin = q4_k_d_dmin(d_dmin[:, :, None])
        a, m, c = a[:, :, None], m[:, :, None], c[:, :, None]
        x_at = x_words + (b0 + step[:, None, None]) * 64 + 16 * j[None, :, None] + i[None, None, :]
        dot_low = tl.sum(dp4a(codes & 0x0F0F0F0F, tl.load(x_at)[None], DP4A), axis=3).to(tl.float32)
        dot_high = tl.sum(dp4a((codes >> 4) & 0x0F0F0F0F, tl.load(x_at + 8)[None], DP4A), axis=3).to(tl.float32)
        run = x_row * (K // 32) + (b0 + step[:, None]) * 8 + 2 * j[None, :]
        acc += _q4_k_pair_sums(d, dmin, a, m, c, low_sub, dot_low, dot_high, xd_ptr, xs_ptr, run[None])
    store_split_output(tl.sum(tl.sum(acc, axis=2), axis=1), tl.program_id(0), rows, rows < N, out_ptr, stride_om,
                       work_ptr, counts_ptr, M, N, SPLITS, SPLIT)


@triton.jit
def _q6_k_q8_gemv_kernel(xq_ptr, xd_ptr, w_ptr, out_ptr, work_ptr, counts_ptr, experts_ptr, expert_bytes,
                         M, N, K, row_halves, SPLIT_BLOCKS, SPLITS, stride_om,
                         BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT: tl.constexpr, DP4A: tl.constexpr,
                         EXPERTS: tl.constexpr, X_ROW_DIV: tl.constexpr, PDL: tl.constexpr):
    """x @ W^T for one row of x, quantized by _quantize_q8_kernel, and BLOCK_N rows of Q6_K W, BLOCK_B blocks a
    step. A 210-byte block is 2-byte aligned, so its words are read as pairs of 16-bit halves. Element
    128h + 32(2 p2 + p1) + 4i + b takes its low four bits from byte b of word 16h + 8p1 + i of ql (nibble p2)
    and its high two from byte b of word 8h + i of qh (bits 2(2 p2 + p1)): the tensors below are indexed
    [row, h, p2, p1, g, w] with i = 4g + w, so each ql word is read once for both its nibbles and a scale group
    of 16 elements is one (g) of them. The codes are unsigned (q + 32): a group's dot takes 32 times its sum of
    x back. Where SPLIT, program (.., .., s) takes SPLIT_BLOCKS blocks from block s * SPLIT_BLOCKS. EXPERTS and
    X_ROW_DIV as in gemv_rows."""
    w_ptr, x_words, runs, rows, n_mask = gemv_rows(w_ptr, xq_ptr, experts_ptr, expert_bytes, N, K, BLOCK_N,
                                                   EXPERTS, X_ROW_DIV, PDL)
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
            ql = halves_word(halves, block + ql_at)
            qh = halves_word(halves, block + qh_at)
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
def _q2_q3_k_q8_gemv_kernel(xq_ptr, xd_ptr, w_ptr, out_ptr, work_ptr, counts_ptr, experts_ptr, expert_bytes,
                            M, N, K, row_halves, SPLIT_BLOCKS, SPLITS, stride_om,
                            BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT: tl.constexpr, DP4A: tl.constexpr,
                            EXPERTS: tl.constexpr, X_ROW_DIV: tl.constexpr, Q2_K: tl.constexpr, PDL: tl.constexpr):
    """x @ W^T for one row of x, quantized by _quantize_q8_kernel, and BLOCK_N rows of Q3_K W (Q2_K where Q2_K),
    BLOCK_B blocks a step. A 110-byte Q3_K block (hmask[32], qs[64], 12 bytes of 6-bit scales, fp16 d) and an
    84-byte Q2_K block (16 bytes of 4-bit scales and mins, qs[64], fp16 d and dmin) are 2-byte aligned, so their
    words are read as pairs of 16-bit halves. Element 128h + 32p + 4i + b takes its low two bits from bits 2p of
    byte b of qs word 8h + i and, in Q3_K, its third from bit 4h + p of byte b of hmask word i: the tensors below
    are indexed [row, h, p, g, w] with i = 4g + w, so a scale group of 16 elements is one (h, p, g). Q3_K's codes
    are unsigned (q + 4): a group's dot takes 4 times its sum of x back. Q2_K's group is w = d sc q - dmin m with
    its scale byte's low nibble sc and high one m: m times the group's sum of x comes off. Where SPLIT, program
    (.., .., s) takes SPLIT_BLOCKS blocks from block s * SPLIT_BLOCKS. EXPERTS and X_ROW_DIV as in gemv_rows."""
    w_ptr, x_words, runs, rows, n_mask = gemv_rows(w_ptr, xq_ptr, experts_ptr, expert_bytes, N, K, BLOCK_N,
                                                   EXPERTS, X_ROW_DIV, PDL)
    block_halves: tl.constexpr = 42 if Q2_K else 55
    halves = w_ptr.to(tl.pointer_type(tl.uint16))
    row_base = (tl.where(n_mask, rows, 0).to(tl.int64) * row_halves)[:, None, None, None, None]
    h = tl.arange(0, 2)[None, :, None, None, None]
    p = tl.arange(0, 4)[None, None, :, None, None]
    g = tl.arange(0, 2)[None, None, None, :, None]
    i = 4 * g + tl.arange(0, 4)[None, None, None, None, :]
    qs_at = (8 if Q2_K else 16) + 16 * h + 2 * i
    hmask_at = 2 * i
    x_at = 32 * h + 8 * p + i
    sub = (8 * h + 2 * p + g).reshape(1, 2, 4, 2)
    low_shift = 4 * (sub // 8)
    high_shift = 2 * (sub // 4)
    run = (4 * h + p).reshape(1, 2, 4, 1)
    acc = tl.zeros([BLOCK_N, 2, 4, 2], dtype=tl.float32)
    b_begin = tl.program_id(2) * SPLIT_BLOCKS
    for b0 in range(b_begin, tl.minimum(K // 256, b_begin + SPLIT_BLOCKS), BLOCK_B):
        for bb in tl.static_range(BLOCK_B):
            blk = b0 + bb
            block = row_base + blk * block_halves
            codes = (halves_word(halves, block + qs_at) >> (2 * p)) & 0x03030303
            if not Q2_K:
                codes |= ((halves_word(halves, block + hmask_at) >> (4 * h + p)) & 0x01010101) << 2
            x = tl.load(x_words + blk * 64 + x_at)
            dot = tl.sum(dp4a(codes, x, DP4A), axis=4)
            x_sum = tl.sum(dp4a(tl.full(x.shape, 0x01010101, tl.int32), x, DP4A), axis=4)
            block = block.reshape(BLOCK_N, 1, 1, 1)
            xd = tl.load(xd_ptr + runs + blk * 8 + run)
            if Q2_K:
                scale_min = tl.load(w_ptr + 2 * block + sub)
                d = tl.load(halves + block + 40).to(tl.float16, bitcast=True).to(tl.float32)
                dmin = tl.load(halves + block + 41).to(tl.float16, bitcast=True).to(tl.float32)
                acc += xd * (d * (scale_min & 15).to(tl.float32) * dot.to(tl.float32)
                             - dmin * (scale_min >> 4).to(tl.float32) * x_sum.to(tl.float32))
            else:
                low4 = (tl.load(w_ptr + 2 * block + 96 + sub % 8).to(tl.int32) >> low_shift) & 15
                high2 = (tl.load(w_ptr + 2 * block + 104 + sub % 4).to(tl.int32) >> high_shift) & 3
                scale = ((low4 | (high2 << 4)) - 32).to(tl.float32)
                d = tl.load(halves + block + 54).to(tl.float16, bitcast=True)
                acc += d.to(tl.float32) * scale * xd * (dot - 4 * x_sum).to(tl.float32)
    total = tl.sum(tl.sum(tl.sum(acc, axis=3), axis=2), axis=1)
    store_split_output(total, tl.program_id(0), rows, n_mask, out_ptr, stride_om, work_ptr, counts_ptr, M, N, SPLITS,
                       SPLIT)


@triton.jit
def _iq4_xs_q8_gemv_kernel(xq_ptr, xd_ptr, w_ptr, out_ptr, work_ptr, counts_ptr, experts_ptr, expert_bytes,
                           M, N, K, row_words, SPLIT_BLOCKS, SPLITS, stride_om,
                           BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT: tl.constexpr, DP4A: tl.constexpr,
                           EXPERTS: tl.constexpr, X_ROW_DIV: tl.constexpr, PDL: tl.constexpr):
    """x @ W^T for one row of x, quantized by _quantize_q8_kernel, and BLOCK_N rows of IQ4_XS W, BLOCK_B blocks a
    step. A 136-byte block reads as int32 words: word 0 holds fp16 d and the 2-bit high parts of the eight 6-bit
    scales, word 1 their low nibbles, then sub-block s (32 elements) is words 2 + 4s .. 5 + 4s, IQ4_NL's 16 bytes
    of codes (element l in the low nibble of byte l, 16 + l in the high one): w = d (scale - 32) IQ4_LEVELS[q].
    Where SPLIT, program (.., .., s) takes SPLIT_BLOCKS blocks from block s * SPLIT_BLOCKS. EXPERTS and X_ROW_DIV
    as in gemv_rows."""
    w_ptr, x_words, runs, rows, n_mask = gemv_rows(w_ptr, xq_ptr, experts_ptr, expert_bytes, N, K, BLOCK_N,
                                                   EXPERTS, X_ROW_DIV, PDL)
    words = w_ptr.to(tl.pointer_type(tl.int32))
    row_base = tl.where(n_mask, rows, 0).to(tl.int64) * row_words
    sub = tl.arange(0, 8)
    i = tl.arange(0, 4)
    acc = tl.zeros([BLOCK_N, 8], dtype=tl.float32)
    b_begin = tl.program_id(2) * SPLIT_BLOCKS
    for b0 in range(b_begin, tl.minimum(K // 256, b_begin + SPLIT_BLOCKS), BLOCK_B):
        for bb in tl.static_range(BLOCK_B):
            blk = b0 + bb
            block = row_base + blk * 34
            codes = tl.load(words + block[:, None, None] + 2 + 4 * sub[None, :, None] + i[None, None, :])
            x_low = tl.load(x_words + blk * 64 + 8 * sub[:, None] + i[None, :])[None, :, :]
            x_high = tl.load(x_words + blk * 64 + 8 * sub[:, None] + 4 + i[None, :])[None, :, :]
            dot = tl.sum(dp4a_signed(iq4_level_bytes(codes & 0x0F0F0F0F, DP4A), x_low, DP4A)
                         + dp4a_signed(iq4_level_bytes((codes >> 4) & 0x0F0F0F0F, DP4A), x_high, DP4A), axis=2)
            head = tl.load(words + block)[:, None]
            d = (head & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            low4 = (tl.load(words + block + 1)[:, None] >> (4 * sub[None, :])) & 15
            high2 = (head >> (16 + 2 * sub[None, :])) & 3
            scale = ((low4 | (high2 << 4)) - 32).to(tl.float32)
            xd = tl.load(xd_ptr + runs + blk * 8 + sub)[None, :]
            acc += d * scale * xd * dot.to(tl.float32)
    store_split_output(tl.sum(acc, axis=1), tl.program_id(0), rows, n_mask, out_ptr, stride_om, work_ptr,
                       counts_ptr, M, N, SPLITS, SPLIT)
