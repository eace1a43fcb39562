"""The int8 GEMVs of every quantized GGUF type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL,
IQ4_XS): x rounded to int8 in runs of 32 (llama.cpp's Q8_1, wick/kernels/int8_activations.py) meets four weight
codes at a time in dp4a, each sub-block's integer sum taking its scales once, since decoding each weight to a float
cost more instructions than its bytes took to arrive. IQ4's codes become their levels' bytes by two byte permutes
first. One program owns BLOCK_N rows of W for one row of x, K split among programs where the rows alone leave the
SMs short (gemv_split.py). With experts, each output row is a (token, expert) pair and its expert is picked in the
kernel. On Hopper the Q4_K GEMV takes its blocks by the tensor memory accelerator instead, a few steps of them in
flight (Triton's pipeliner): its loads then no longer wait on each other's addresses and arrive whole.

This file holds the kernels of the types of 32-value blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL), each type's
config and the launch of every type's GEMV; the kernels of the 256-value super-blocks are in gguf_k_gemv.py.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType
from triton.tools.tensor_descriptor import TensorDescriptor

from wick.kernels.gemv_split import SplitK, fit_grid_rows, store_split_output
from wick.kernels.gguf_k_gemv import (
    _iq4_xs_q8_gemv_kernel,
    _k_q8_gemv_kernel,
    _q2_q3_k_q8_gemv_kernel,
    _q4_k_q8_tma_gemv_kernel,
    _q6_k_q8_gemv_kernel,
    gemv_rows,
)
from wick.kernels.gguf_words import halves_word, iq4_level_bytes
from wick.kernels.int8_activations import DP4A, Int8Rows, dp4a, dp4a_signed, quantize_q8
from wick.kernels.pdl import hopper_or_later, pdl_options

T = GGMLQuantizationType
# Rows of W per program, blocks per step, warps, and the warps an SM that splitting K aims at (0: no split)
# of the Q4_K GEMV (benchmarks/kernels/bench_quant_gemv.py).
Q4_K_GEMV_CONFIG = (8, 2, 1, 16)
# The same for the Q5_K GEMV (Q4_K's kernel with a fifth bit).
Q5_K_GEMV_CONFIG = Q4_K_GEMV_CONFIG
# The same for the Q4_K GEMV whose blocks come by the tensor memory accelerator (Hopper on), and the steps of blocks
# it keeps in flight. Llama-3.1-8B's layers on an H200 (session 36, each over cold copies): 54.0 us against 76.9 for
# the kernel above in the same run (qkv 9.1, o 8.4, gate_up 21.3, down 15.2 us). Q5_K's GEMV by TMA was no faster
# in the model (347.6 against 350.4 tok/s): Q5_K keeps the kernel above.
Q4_K_TMA_GEMV_CONFIG = (8, 4, 2, 32)
Q4_K_TMA_STAGES = 3
# Fewer rows a program than this fault on an H200 (misaligned address: 1, 2 and 4 rows with one block a step, 1 row
# with four); such tiles take _k_q8_gemv_kernel.
Q4_K_TMA_MIN_ROWS = 8
# The same for the Q3_K GEMV.
Q3_K_GEMV_CONFIG = (4, 1, 1, 16)
# The same for the Q6_K GEMV.
Q6_K_GEMV_CONFIG = (4, 1, 1, 16)
# The same for the Q8_0 GEMV, whose "blocks" are groups of eight 32-value blocks (256 columns).
Q8_0_GEMV_CONFIG = (4, 1, 1, 16)
# The same for the Q4_0 GEMV, in groups of eight blocks too (Llama-3.1-8B's layers on an H100: 111.5 us against 120.8
# at Q8_0's), and for Q4_1, Q5_0 and Q5_1 (its kernel with a minimum or a fifth bit).
Q4_0_GEMV_CONFIG = (8, 2, 2, 16)
Q4_1_GEMV_CONFIG = Q5_0_GEMV_CONFIG = Q5_1_GEMV_CONFIG = Q4_0_GEMV_CONFIG
# The same for IQ4_NL, whose block is Q4_0's with its codes indexing IQ4_LEVELS (Q4_0's kernel too; Llama-3.1-8B's
# layers: 111.3 us against 116.1 at Q4_0's).
IQ4_NL_GEMV_CONFIG = (8, 1, 2, 32)
# The same for the Q2_K GEMV (81.0 us against 86.4 at Q3_K's).
Q2_K_GEMV_CONFIG = (4, 2, 1, 16)
# The same for the IQ4_XS GEMV (91.2 us against 100.4 at Q4_K's).
IQ4_XS_GEMV_CONFIG = (4, 2, 1, 32)
# Each such type's config, its block in 16-bit halves, whether it has a minimum m, a fifth bit, IQ4 levels.
_Q4_Q5_BLOCKS = {T.Q4_0: (Q4_0_GEMV_CONFIG, 9, False, False, False),
                 T.Q4_1: (Q4_1_GEMV_CONFIG, 10, True, False, False),
                 T.Q5_0: (Q5_0_GEMV_CONFIG, 11, False, True, False),
                 T.Q5_1: (Q5_1_GEMV_CONFIG, 12, True, True, False),
                 T.IQ4_NL: (IQ4_NL_GEMV_CONFIG, 9, False, False, True)}


@triton.jit
def _q8_0_q8_gemv_kernel(xq_ptr, xd_ptr, xs_ptr, w_ptr, out_ptr, work_ptr, counts_ptr, experts_ptr, expert_bytes,
                         M, N, K, row_halves, SPLIT_BLOCKS, SPLITS, stride_om,
                         BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT: tl.constexpr, DP4A: tl.constexpr,
                         EXPERTS: tl.constexpr, X_ROW_DIV: tl.constexpr, PDL: tl.constexpr):
    """x @ W^T for one row of x, quantized by _quantize_q8_kernel, and BLOCK_N rows of Q8_0 W, BLOCK_B groups of
    eight blocks (256 columns) a step. A 34-byte block (fp16 d, 32 int8 codes) is 2-byte aligned, so its code words
    are read as pairs of 16-bit halves. dp4a takes unsigned codes: q + 128 (the sign bit flipped), and 128 times
    the run's sum of x (xs) comes back off. Where SPLIT, program (.., .., s) takes SPLIT_BLOCKS groups from group
    s * SPLIT_BLOCKS. EXPERTS and X_ROW_DIV as in gemv_rows."""
    w_ptr, x_words, runs, rows, n_mask = gemv_rows(w_ptr, xq_ptr, experts_ptr, expert_bytes, N, K, BLOCK_N,
                                                   EXPERTS, X_ROW_DIV, PDL)
    halves = w_ptr.to(tl.pointer_type(tl.uint16))
    row_base = tl.where(n_mask, rows, 0).to(tl.int64) * row_halves
    j = tl.arange(0, 8)
    i = tl.arange(0, 8)[None, None, :]
    acc = tl.zeros([BLOCK_N, 8], dtype=tl.float32)
    b_begin = tl.program_id(2) * SPLIT_BLOCKS
    for b0 in range(b_begin, tl.minimum(K // 256, b_begin + SPLIT_BLOCKS), BLOCK_B):
        for bb in tl.static_range(BLOCK_B):
            group = b0 + bb
            block = row_base[:, None] + (8 * group + j[None, :]) * 17
            word = block[:, :, None] + 1 + 2 * i
            codes = halves_word(halves, word)
            x = tl.load(x_words + group * 64 + 8 * j[None, :, None] + i)
            dot = tl.sum(dp4a(codes ^ -0x7F7F7F80, x, DP4A), axis=2).to(tl.float32)  # -0x7F7F7F80: 0x80808080
            d = tl.load(halves + block).to(tl.float16, bitcast=True).to(tl.float32)
            xd = tl.load(xd_ptr + runs + group * 8 + j)[None, :]
            xs = tl.load(xs_ptr + runs + group * 8 + j)[None, :]
            acc += d * (xd * dot - 128.0 * xs)
    store_split_output(tl.sum(acc, axis=1), tl.program_id(0), rows, n_mask, out_ptr, stride_om, work_ptr,
                       counts_ptr, M, N, SPLITS, SPLIT)


@triton.jit
def _fifth_bits(qh, first):
    """Bits first .. first + 3 of qh (per element of `first`) moved to bit 4 of bytes 0 .. 3."""
    t = qh >> first
    return ((t & 1) | ((t & 2) << 7) | ((t & 4) << 14) | ((t & 8) << 21)) << 4


@triton.jit
def _q4_q5_q8_gemv_kernel(xq_ptr, xd_ptr, xs_ptr, w_ptr, out_ptr, work_ptr, counts_ptr, experts_ptr, expert_bytes,
                          M, N, K, row_halves, SPLIT_BLOCKS, SPLITS, stride_om,
                          BLOCK_N: tl.constexpr, BLOCK_B: tl.constexpr, SPLIT: tl.constexpr, DP4A: tl.constexpr,
                          EXPERTS: tl.constexpr, X_ROW_DIV: tl.constexpr, BLOCK_HALVES: tl.constexpr,
                          HAS_MIN: tl.constexpr, FIFTH_BIT: tl.constexpr, LEVELS: tl.constexpr, PDL: tl.constexpr):
    """x @ W^T for one row of x, quantized by _quantize_q8_kernel, and BLOCK_N rows of Q4_0 W (Q4_1 where HAS_MIN,
    Q5_0 where FIFTH_BIT, Q5_1 where both, IQ4_NL where LEVELS), BLOCK_B groups of eight 32-value blocks a step. A
    block (fp16 d, Q4_1's and Q5_1's fp16 m, Q5's 32 fifth bits, then 16 bytes of codes) is BLOCK_HALVES 16-bit
    halves. Byte l of the codes holds element l in its low nibble and element 16 + l in its high one, so code word i
    meets x's words i and 4 + i; element e's fifth bit is bit e of the fifth-bit word. Q4_0 and Q5_0 are w = d (q - 8)
    and d (q - 16): 8 or 16 times the run's sum of x (xs) comes back off; Q4_1 and Q5_1 are w = d q + m: m xs comes
    on; IQ4_NL is w = d IQ4_LEVELS[q], the levels signed bytes for dp4a. Where SPLIT, program (.., .., s) takes
    SPLIT_BLOCKS groups from group s * SPLIT_BLOCKS. EXPERTS and X_ROW_DIV as in gemv_rows."""
    w_ptr, x_words, runs, rows, n_mask = gemv_rows(w_ptr, xq_ptr, experts_ptr, expert_bytes, N, K, BLOCK_N,
                                                   EXPERTS, X_ROW_DIV, PDL)
    halves = w_ptr.to(tl.pointer_type(tl.uint16))
    codes_at: tl.constexpr = BLOCK_HALVES - 8
    offset: tl.constexpr = 0.0 if HAS_MIN else 16.0 if FIFTH_BIT else 8.0
    row_base = tl.where(n_mask, rows, 0).to(tl.int64) * row_halves
    j = tl.arange(0, 8)
    i = tl.arange(0, 4)[None, None, :]
    acc = tl.zeros([BLOCK_N, 8], dtype=tl.float32)
    b_begin = tl.program_id(2) * SPLIT_BLOCKS
    for b0 in range(b_begin, tl.minimum(K // 256, b_begin + SPLIT_BLOCKS), BLOCK_B):
        for bb in tl.static_range(BLOCK_B):
            group = b0 + bb
            block = row_base[:, None] + (8 * group + j[None, :]) * BLOCK_HALVES
            codes = halves_word(halves, block[:, :, None] + codes_at + 2 * i)
            low = codes & 0x0F0F0F0F
            high = (codes >> 4) & 0x0F0F0F0F
            if FIFTH_BIT:
                qh = halves_word(halves, block + (2 if HAS_MIN else 1))[:, :, None]
                low |= _fifth_bits(qh, 4 * i)
                high |= _fifth_bits(qh, 16 + 4 * i)
            x_low = tl.load(x_words + group * 64 + 8 * j[None, :, None] + i)
            x_high = tl.load(x_words + group * 64 + 8 * j[None, :, None] + 4 + i)
            d = tl.load(halves + block).to(tl.float16, bitcast=True).to(tl.float32)
            xd = tl.load(xd_ptr + runs + group * 8 + j)[None, :]
            if LEVELS:
                dot = tl.sum(dp4a_signed(iq4_level_bytes(low, DP4A), x_low, DP4A)
                             + dp4a_signed(iq4_level_bytes(high, DP4A), x_high, DP4A), axis=2).to(tl.float32)
                acc += d * xd * dot
            else:
                dot = tl.sum(dp4a(low, x_low, DP4A) + dp4a(high, x_high, DP4A), axis=2).to(tl.float32)
                xs = tl.load(xs_ptr + runs + group * 8 + j)[None, :]
                acc += d * (xd * dot - offset * xs)
                if HAS_MIN:
                    acc += tl.load(halves + block + 1).to(tl.float16, bitcast=True).to(tl.float32) * xs
    store_split_output(tl.sum(acc, axis=1), tl.program_id(0), rows, n_mask, out_ptr, stride_om, work_ptr,
                       counts_ptr, M, N, SPLITS, SPLIT)



def launch_int8_gemv(x: torch.Tensor | Int8Rows, data: torch.Tensor, qtype: GGMLQuantizationType, out: torch.Tensor,
                      experts: torch.Tensor | None, x_row_div: int, gemv_config: tuple[int, int, int, int] | None,
                      split_k: int | None) -> None:
    """out [rows, N] = each row's x row @ W^T by the int8 GEMV of `qtype`; data [N, row bytes], or with `experts`
    (each output row's expert) [experts, N, row bytes], x's row then the output row // x_row_div. x: float rows,
    or rows already rounded to int8 (quantize_q8's, not interleaved)."""
    kernel, default, row_unit, takes_sums, options = _int8_gemv(qtype, data)
    xq, xd, xs = x if isinstance(x, Int8Rows) else quantize_q8(x)
    m, n = out.shape
    k = xq.shape[1]
    block_n, block_b, warps, split_warps = gemv_config or default
    block_n = fit_grid_rows(n, block_n)
    if kernel is _q4_k_q8_tma_gemv_kernel and block_n < Q4_K_TMA_MIN_ROWS:
        kernel, options = _k_q8_gemv_kernel, {"FIFTH_BIT": False}
    while (k // 256) % block_b:
        block_b //= 2
    grid = (m, triton.cdiv(n, block_n))
    split = SplitK(k // 256 // block_b, m * grid[1], warps, split_warps, out, split_k)
    x_args = (xq, xd, xs) if takes_sums else (xq, xd)
    experts_arg = out if experts is None else experts
    launch = dict(BLOCK_N=block_n, BLOCK_B=block_b, SPLIT=split.splits > 1, DP4A=DP4A, EXPERTS=experts is not None,
                  X_ROW_DIV=x_row_div, num_warps=warps, **options, **pdl_options(xq))
    if kernel is _q4_k_q8_tma_gemv_kernel:
        kernel[(*grid, split.splits)](
            *x_args, *_q4_k_block_descriptors(data, block_n, block_b), out, split.work,
            split.counts, experts_arg, m, n, k, split.steps * block_b, split.splits, out.stride(0),
            STAGES=Q4_K_TMA_STAGES, **launch)
    else:
        kernel[(*grid, split.splits)](
            *x_args, data, out, split.work, split.counts, experts_arg, 0 if experts is None else data.stride(0), m, n,
            k, data.stride(-2) // row_unit, split.steps * block_b, split.splits, out.stride(0), **launch)


def _q4_k_block_descriptors(data: torch.Tensor, block_n: int,
                            block_b: int) -> tuple[TensorDescriptor, TensorDescriptor]:
    """The descriptors of _q4_k_q8_tma_gemv_kernel over Q4_K blocks `data` [..., N, row bytes] (contiguous): the
    heads and the low bits of [block_n rows, block_b blocks]."""
    words = data.view(torch.int32).view(-1, data.shape[-1] // 144, 36)
    return (TensorDescriptor.from_tensor(words, [block_n, block_b, 4]),
            TensorDescriptor.from_tensor(words, [block_n, block_b, 32]))


def _int8_gemv(qtype: GGMLQuantizationType, data: torch.Tensor) -> tuple | None:
    """(kernel, default config, bytes of its unit of row stride, whether it takes x's run sums, its options) of
    the int8 GEMV that runs `data`, or None."""
    if qtype == T.Q4_K and _takes_descriptors(data):
        return _q4_k_q8_tma_gemv_kernel, Q4_K_TMA_GEMV_CONFIG, 4, True, {}
    if qtype in (T.Q4_K, T.Q5_K) and _rows_aligned(data, 4):
        fifth_bit = qtype == T.Q5_K
        return (_k_q8_gemv_kernel, Q5_K_GEMV_CONFIG if fifth_bit else Q4_K_GEMV_CONFIG, 4, True,
                {"FIFTH_BIT": fifth_bit})
    if qtype == T.Q6_K and _rows_aligned(data, 2):
        return _q6_k_q8_gemv_kernel, Q6_K_GEMV_CONFIG, 2, False, {}
    if qtype == T.Q3_K and _rows_aligned(data, 2):
        return _q2_q3_k_q8_gemv_kernel, Q3_K_GEMV_CONFIG, 2, False, {"Q2_K": False}
    if qtype == T.Q8_0 and _rows_aligned(data, 2) and data.shape[-1] % (8 * 34) == 0:  # whole 256-column groups
        return _q8_0_q8_gemv_kernel, Q8_0_GEMV_CONFIG, 2, True, {}
    if qtype == T.Q2_K and _rows_aligned(data, 2):
        return _q2_q3_k_q8_gemv_kernel, Q2_K_GEMV_CONFIG, 2, False, {"Q2_K": True}
    if qtype == T.IQ4_XS and _rows_aligned(data, 4):
        return _iq4_xs_q8_gemv_kernel, IQ4_XS_GEMV_CONFIG, 4, False, {}
    if qtype in _Q4_Q5_BLOCKS and _rows_aligned(data, 2):
        config, block_halves, has_min, fifth_bit, levels = _Q4_Q5_BLOCKS[qtype]
        if data.shape[-1] % (8 * 2 * block_halves) == 0:  # whole 256-column groups
            return (_q4_q5_q8_gemv_kernel, config, 2, True,
                    {"BLOCK_HALVES": block_halves, "HAS_MIN": has_min, "FIFTH_BIT": fifth_bit, "LEVELS": levels})
    return None


def runs_int8_gemv(qtype: GGMLQuantizationType, data: torch.Tensor) -> bool:
    """Whether an int8 GEMV runs `data` [N, row bytes] of `qtype`."""
    return _int8_gemv(qtype, data) is not None


def _takes_descriptors(data: torch.Tensor) -> bool:
    """Whether `data`'s blocks can come by the tensor memory accelerator: on Hopper and later (and in the interpreter
    on the CPU, which runs the same path), contiguous from a 16-byte bound (a Q4_K block is 144 bytes), not empty (a
    descriptor's dimensions are not 0)."""
    return (data.numel() > 0 and data.is_contiguous() and data.data_ptr() % 16 == 0
            and (data.device.type == "cpu" or (data.is_cuda and hopper_or_later(data.device))))


def _rows_aligned(data: torch.Tensor, unit: int) -> bool:
    """Whether rows can be read in units of `unit` bytes (16-bit halves, int32 words): contiguous rows that, and
    their start, are `unit`-byte aligned."""
    return data.stride(-1) == 1 and data.stride(0) % unit == 0 and data.data_ptr() % unit == 0
