"""Activations rounded to int8 for the 4-bit GEMVs (llama.cpp's Q8_1): each run of 32 values of a row of x
becomes int8 codes q = round(x / d) with d = max|x| / 127, and the GEMVs multiply four weight codes by four
of x's at a time (PTX dp4a), summing in integers before any scale applies."""

from __future__ import annotations

import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl

# dp4a is PTX: compiled kernels take it, the interpreter spells it out.
DP4A = os.environ.get("TRITON_INTERPRET", "0") != "1"


class Int8Rows(NamedTuple):
    """Rows of x rounded to int8 by quantize_q8 (or by the norm kernel that wrote x, kernels/rms_norm.row_norm_q8):
    codes q [M, K], and per run of 32 d and d * sum(codes) [M, K / 32] (float32)."""

    q: torch.Tensor
    d: torch.Tensor
    s: torch.Tensor


@triton.jit
def dp4a(a, b, DP4A: tl.constexpr):
    """Sum over the four bytes of unsigned a times signed b (int32 words)."""
    return _dp4a(a, b, False, DP4A)


@triton.jit
def dp4a_signed(a, b, DP4A: tl.constexpr):
    """Sum over the four bytes of signed a times signed b (int32 words)."""
    return _dp4a(a, b, True, DP4A)


@triton.jit
def _dp4a(a, b, SIGNED_A: tl.constexpr, DP4A: tl.constexpr):
    if DP4A:
        if SIGNED_A:
            return tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, tl.zeros_like(a)],
                                             dtype=tl.int32, is_pure=True, pack=1)
        else:
            return tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, tl.zeros_like(a)],
                                             dtype=tl.int32, is_pure=True, pack=1)
    else:
        total = tl.zeros_like(a)
        for k in tl.static_range(4):
            a_byte = ((a << (24 - 8 * k)) >> 24) if SIGNED_A else ((a >> (8 * k)) & 255)
            total += a_byte * ((b << (24 - 8 * k)) >> 24)
        return total


@triton.jit
def byte_perm(a, b, selector, DP4A: tl.constexpr):
    """Byte k of the result is byte s of the eight bytes of a (0-3) then b (4-7), s = nibble k of selector (each
    of the four low nibbles in 0..7): PTX prmt."""
    if DP4A:
        return tl.inline_asm_elementwise("prmt.b32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, selector],
                                         dtype=tl.int32, is_pure=True, pack=1)
    else:
        out = tl.zeros_like(a)
        for k in tl.static_range(4):
            s = (selector >> (4 * k)) & 7
            out |= ((tl.where(s < 4, a, b) >> (8 * (s & 3))) & 255) << (8 * k)
        return out


@triton.jit
def quantize_runs(x):
    """x [runs, 32] in float32 -> its int8 codes (as int32), d and d * sum(codes) [runs]. The rounding is one fused
    multiply-add, so that a kernel compiled without contraction (the norm's) rounds as this module's does."""
    d = tl.max(tl.abs(x), axis=1) / 127.0
    inv = tl.where(d > 0, 1.0 / tl.maximum(d, 1e-30), 0.0)
    q = tl.floor(tl.fma(x, inv[:, None], 0.5)).to(tl.int32)
    return q, d, d * tl.sum(q, axis=1).to(tl.float32)


@triton.jit
def store_runs(x, q_ptr, d_ptr, s_ptr, runs, K, INTERLEAVE: tl.constexpr):
    """Rounds x [runs, 32] (float32; runs past K / 32 are not stored) and stores one row's codes, d and sums at
    q_ptr, d_ptr and s_ptr. INTERLEAVE stores each eight codes as the even ones then the odd ones, so that a word
    of eight 4-bit weights (GPTQ's) meets x's codes in two dp4a: its low nibbles against the first four, its high
    nibbles against the last."""
    q, d, s = quantize_runs(x)
    if INTERLEAVE:  # code 8g + 2p + b to 8g + 4b + p, in registers: stores to scattered bytes cost a one-program
        # norm (rms_norm.row_norm_q8) 2.5 us more on an H200
        q = tl.reshape(tl.permute(tl.reshape(q, [q.shape[0], 4, 4, 2]), [0, 1, 3, 2]), [q.shape[0], 32])
    run_mask = runs < K // 32
    tl.store(q_ptr + runs[:, None] * 32 + tl.arange(0, 32)[None, :], q.to(tl.int8), mask=run_mask[:, None])
    tl.store(d_ptr + runs, d, mask=run_mask)
    tl.store(s_ptr + runs, s, mask=run_mask)


@triton.jit
def _quantize_q8_kernel(x_ptr, q_ptr, d_ptr, s_ptr, K, stride_xm, CHUNKS: tl.constexpr, INTERLEAVE: tl.constexpr):
    """CHUNKS runs of one row of x: codes, d and d * sum(codes) per run (store_runs).

    Launched without PDL (pdl.py), so the int8 GEMV after it launches only once the kernels before have ended:
    its programs, one wave sized to the SMs, launched into a busy GPU would crowd onto the SMs left free (Llama-
    3.1-8B in Q4_K at batch 1 fell from 1.71x to 1.29x bf16, docs/benchmarks.md, session 21)."""
    row = tl.program_id(0).to(tl.int64)
    runs = tl.program_id(1) * CHUNKS + tl.arange(0, CHUNKS)
    offs = runs[:, None] * 32 + tl.arange(0, 32)[None, :]
    x = tl.load(x_ptr + row * stride_xm + offs, mask=offs < K, other=0.0).to(tl.float32)
    store_runs(x, q_ptr + row * K, d_ptr + row * (K // 32), s_ptr + row * (K // 32), runs, K, INTERLEAVE)


def int8_rows_like(x: torch.Tensor) -> Int8Rows:
    """Uninitialized Int8Rows for x [M, K] (K a multiple of 32)."""
    m, k = x.shape
    d = torch.empty(m, k // 32, dtype=torch.float32, device=x.device)
    return Int8Rows(torch.empty(m, k, dtype=torch.int8, device=x.device), d, torch.empty_like(d))


def quantize_q8(x: torch.Tensor, interleave: bool = False) -> Int8Rows:
    """x [M, K] (K a multiple of 32) -> int8 codes [M, K], scales d and d * sum(codes) [M, K / 32] (float32)."""
    m, k = x.shape
    q, d, s = rows = int8_rows_like(x)
    chunks = 8
    _quantize_q8_kernel[(m, triton.cdiv(k // 32, chunks))](x, q, d, s, k, x.stride(0), CHUNKS=chunks,
                                                            INTERLEAVE=interleave)
    return rows


def quantize_q8_ref(x: torch.Tensor) -> torch.Tensor:
    """The values quantize_q8 leaves of x: float32 [M, K]."""
    runs = x.float().reshape(x.shape[0], -1, 32)
    d = runs.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / d.clamp_min(1e-30), torch.zeros_like(d))
    return (torch.floor(runs * inv + 0.5) * d).reshape(x.shape)
