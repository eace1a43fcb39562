"""GGUF blocks decoded in Triton kernels, element by element, for every quantized type the loader reads: the
float GEMV and the one-kernel dequantization. It follows wick/loader/gguf_dequant.py, which is the reference in the
tests.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from gguf import GGMLQuantizationType

from wick.loader.gguf_dequant import IQ4_LEVELS

T = GGMLQuantizationType
TRITON_CODES = {T.Q4_0: 0, T.Q4_1: 1, T.Q5_0: 2, T.Q5_1: 3, T.Q8_0: 4, T.Q2_K: 5, T.Q3_K: 6, T.Q4_K: 7,
                T.Q5_K: 8, T.Q6_K: 9, T.IQ4_NL: 10, T.IQ4_XS: 11}
TRITON_TYPES: frozenset[GGMLQuantizationType] = frozenset(TRITON_CODES)


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
def decode(block, e, levels_ptr, QTYPE: tl.constexpr):
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


@functools.cache
def iq4_levels(device: torch.device) -> torch.Tensor:
    # Made on the first (eager) call, before any CUDA graph capture.
    return torch.tensor(IQ4_LEVELS, dtype=torch.float32, device=device)
