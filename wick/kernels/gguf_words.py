"""Readers of GGUF blocks' words, shared by the int8 GEMVs (gguf_int8_gemv.py) and the tiles (gguf_tiles.py):
a Q4_K block's head and its 6-bit scales and minimums, int32 words from 2-byte aligned blocks, and IQ4 codes turned
into their levels' signed bytes."""

from __future__ import annotations

import triton
import triton.language as tl

from wick.kernels.int8_activations import byte_perm
from wick.loader.gguf_dequant import IQ4_LEVELS


def _level_word(first: int) -> tl.constexpr:
    """IQ4_LEVELS[first:first + 4] as the signed bytes of an int32, the first lowest."""
    word = int.from_bytes(bytes(level & 255 for level in IQ4_LEVELS[first:first + 4]), "little")
    return tl.constexpr(word - (1 << 32) if word >= 1 << 31 else word)


_LEVELS_0, _LEVELS_4, _LEVELS_8, _LEVELS_12 = (_level_word(first) for first in (0, 4, 8, 12))


@triton.jit
def q4_k_d_dmin(head):
    """d and dmin (float32) from a Q4_K block's first word."""
    d = (head & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return d, ((head >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)


@triton.jit
def q4_k_head(words, block):
    """A Q4_K block's d and dmin (float32) and its scale words a, m, c (bytes 4-7, 8-11, 12-15), for blocks at
    int32 word offsets `block`."""
    d, dmin = q4_k_d_dmin(tl.load(words + block))
    return d, dmin, tl.load(words + block + 1), tl.load(words + block + 2), tl.load(words + block + 3)


@triton.jit
def k_scale_min_words(a, m, c, sub):
    """The 6-bit scales and mins of sub-blocks `sub` (in 0..7) from a Q4_K block's scale words a, m, c (bytes
    4-7, 8-11 and 12-15 of the block), as floats of their broadcast shape."""
    shift = 8 * (sub % 4)
    a_byte = (a >> shift) & 255
    m_byte = (m >> shift) & 255
    c_byte = (c >> shift) & 255
    scale = tl.where(sub < 4, a_byte & 63, (c_byte & 15) | ((a_byte >> 6) << 4))
    minimum = tl.where(sub < 4, m_byte & 63, (c_byte >> 4) | ((m_byte >> 6) << 4))
    return scale.to(tl.float32), minimum.to(tl.float32)


@triton.jit
def halves_word(halves, at):
    """The int32 words at 16-bit half offsets `at` of a 2-byte aligned block, from their two halves."""
    return tl.load(halves + at).to(tl.int32) | (tl.load(halves + at + 1).to(tl.int32) << 16)


@triton.jit
def iq4_level_bytes(codes, DP4A: tl.constexpr):
    """Four 4-bit codes, one in the low nibble of each byte of `codes`, to their IQ4 levels as signed bytes: each
    byte is picked from the table's low eight and from its high eight, and bit 3 of the code chooses."""
    selector = (codes & 0x7) | ((codes >> 4) & 0x70) | ((codes >> 8) & 0x700) | ((codes >> 12) & 0x7000)
    low = byte_perm(tl.full(codes.shape, _LEVELS_0, tl.int32), tl.full(codes.shape, _LEVELS_4, tl.int32), selector,
                    DP4A)
    high = byte_perm(tl.full(codes.shape, _LEVELS_8, tl.int32), tl.full(codes.shape, _LEVELS_12, tl.int32),
                     selector, DP4A)
    upper = ((codes >> 3) & 0x01010101) * 0xFF
    return (low & ~upper) | (high & upper)
