"""Dequantization of GGUF tensors to float32, vectorized over blocks with plain torch ops.

Every quantized format stores a tensor as consecutive fixed-size blocks of bytes. Each decoder
below turns a ``[n_blocks, type_size]`` uint8 tensor into ``[n_blocks, block_size]`` float32,
so the same code runs on CPU and on CUDA.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

QK_K = 256


def _f16(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The float16 stored at ``offset`` of each block, as float32 of shape [n_blocks, 1]."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()


def _split_bits(x: torch.Tensor, width: int) -> torch.Tensor:
    """Split each byte into ``8 // width`` fields of ``width`` bits, lowest first, on a new dim -2."""
    shifts = torch.arange(0, 8, width, dtype=torch.uint8, device=x.device)
    return (x.unsqueeze(-2) >> shifts.unsqueeze(-1)) & ((1 << width) - 1)


def _scaled_runs(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes [n, block] times scales [n, runs], each scale over its run of block / runs codes: float32 [n, block]."""
    n, runs = scales.shape
    return codes.reshape(n, runs, -1).float().mul_(scales.unsqueeze(-1)).reshape(n, -1)


def _low_high_nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[n, 16] bytes -> [n, 32] values: the low nibbles give elements 0..15, the high ones 16..31."""
    return _split_bits(qs, 4).reshape(qs.shape[0], -1)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """[n, 4] bytes of a little-endian uint32 -> [n, 32] bits, bit j for element j."""
    shifts = torch.arange(8, dtype=torch.uint8, device=qh.device)
    return ((qh.unsqueeze(-1) >> shifts) & 1).reshape(qh.shape[0], -1)


def _q5_codes(qs: torch.Tensor, qh: torch.Tensor) -> torch.Tensor:
    """Q5_0 / Q5_1 codes [n, 32] (uint8): the low nibbles of qs [n, 16] and the fifth bits of qh [n, 4]."""
    return _low_high_nibbles(qs) | (_fifth_bits(qh) << 4)


def _k_codes(b: torch.Tensor, qtype: GGMLQuantizationType) -> torch.Tensor:
    """Q4_K or Q5_K blocks' codes [n, 8, 32] (uint8): 32 bytes of low then high nibbles per 64 codes, and Q5_K's
    fifth bits as eight bit planes of 32."""
    n = b.shape[0]
    low = 144 if qtype == GGMLQuantizationType.Q4_K else 176
    codes = _split_bits(b[:, low - 128:low].reshape(n, 4, 32), 4).reshape(n, 8, 32)
    if qtype == GGMLQuantizationType.Q5_K:
        codes |= _split_bits(b[:, 16:48], 1) << 4
    return codes


# The decoders convert the integer codes to float32 once and finish in place on that copy: the
# tensors can be hundreds of megabytes, and each fresh temporary costs as much as the arithmetic.


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    return _low_high_nibbles(b[:, 2:18]).float().sub_(8).mul_(_f16(b, 0))


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _low_high_nibbles(b[:, 4:20]).float().mul_(_f16(b, 0)).add_(_f16(b, 2))


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    return _q5_codes(b[:, 6:22], b[:, 2:6]).float().sub_(16).mul_(_f16(b, 0))


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    return _q5_codes(b[:, 8:24], b[:, 4:8]).float().mul_(_f16(b, 0)).add_(_f16(b, 2))


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return _scaled_runs(*q8_0_codes(b))


def _q2_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    scales = b[:, :16]
    # Each 32-byte half of qs holds 128 elements as four 2-bit planes of 32.
    q = _split_bits(b[:, 16:80].reshape(n, 2, 32), 2).reshape(n, 16, 16)
    dl = (_f16(b, 80) * (scales & 0xF).float()).unsqueeze(-1)
    ml = (_f16(b, 82) * (scales >> 4).float()).unsqueeze(-1)
    return q.float().mul_(dl).sub_(ml).reshape(n, QK_K)


def _q3_k(b: torch.Tensor) -> torch.Tensor:
    n = b.shape[0]
    packed = b[:, 96:108]
    # Sixteen 6-bit scales: low 4 bits from bytes 0..7 (low then high nibbles), top 2 bits from 8..11.
    low = _split_bits(packed[:, :8], 4).reshape(n, 16)
    high = _split_bits(packed[:, 8:], 2).reshape(n, 16)
    scales = (low | (high << 4)).to(torch.int16) - 32
    low_bits = _split_bits(b[:, 32:96].reshape(n, 2, 32), 2).reshape(n, 16, 16)
    # hmask bit (4 * half + plane) of byte l; a clear bit means the value is offset by -4.
    high_bit = _split_bits(b[:, :32], 1).reshape(n, 16, 16)
    q = low_bits.to(torch.int8) - ((1 - high_bit.to(torch.int8)) << 2)
    dl = (_f16(b, 108) * scales.float()).unsqueeze(-1)
    return q.float().mul_(dl).reshape(n, QK_K)


def _k_scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The eight 6-bit scales and mins of a Q4_K / Q5_K block from its 12 packed bytes."""
    a, m, c = packed[:, 0:4], packed[:, 4:8], packed[:, 8:12]
    scales = torch.cat([a & 0x3F, (c & 0xF) | ((a >> 6) << 4)], dim=-1)
    mins = torch.cat([m & 0x3F, (c >> 4) | ((m >> 6) << 4)], dim=-1)
    return scales, mins


def _k_affine(b: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Apply the per-32-element scale and min of a Q4_K / Q5_K block to q: [n, 8, 32]."""
    scales, mins = _k_scales_mins(b[:, 4:16])
    d = (_f16(b, 0) * scales.float()).unsqueeze(-1)
    dm = (_f16(b, 2) * mins.float()).unsqueeze(-1)
    return q.float().mul_(d).sub_(dm).reshape(b.shape[0], QK_K)


def _q4_k(b: torch.Tensor) -> torch.Tensor:
    return _k_affine(b, _k_codes(b, GGMLQuantizationType.Q4_K))


def _q5_k(b: torch.Tensor) -> torch.Tensor:
    return _k_affine(b, _k_codes(b, GGMLQuantizationType.Q5_K))


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    return _scaled_runs(*q6_k_codes(b))


def affine_codes(blocks: torch.Tensor, qtype: GGMLQuantizationType
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q4_0, Q4_1, Q4_K (4-bit codes), Q5_0, Q5_1, Q5_K (5-bit) or Q8_0 (8-bit: its signed codes + 128) blocks
    [n, type_size] as their codes [n, block] (uint8) and each 32 codes' scale and offset [n, block // 32] (float32):
    weight = code * scale + offset."""
    n = blocks.shape[0]
    if qtype == GGMLQuantizationType.Q8_0:
        codes, scale = q8_0_codes(blocks)
        return (codes.to(torch.int16) + 128).to(torch.uint8), scale, scale * -128
    if qtype in (GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q5_0):
        scale = _f16(blocks, 0)
        if qtype == GGMLQuantizationType.Q4_0:
            return _low_high_nibbles(blocks[:, 2:18]), scale, scale * -8
        return _q5_codes(blocks[:, 6:22], blocks[:, 2:6]), scale, scale * -16
    if qtype == GGMLQuantizationType.Q4_1:
        return _low_high_nibbles(blocks[:, 4:20]), _f16(blocks, 0), _f16(blocks, 2)
    if qtype == GGMLQuantizationType.Q5_1:
        return _q5_codes(blocks[:, 8:24], blocks[:, 4:8]), _f16(blocks, 0), _f16(blocks, 2)
    if qtype in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K):
        scales, mins = _k_scales_mins(blocks[:, 4:16])
        codes = _k_codes(blocks, qtype).reshape(n, QK_K)
        return codes, _f16(blocks, 0) * scales.float(), _f16(blocks, 2) * mins.float() * -1
    raise ValueError(f"{qtype.name} is not an affine 4-, 5- or 8-bit GGUF type")


def q6_k_codes(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q6_K blocks [n, 210] as their codes [n, 256] (int8, -32..31) and each 16 codes' scale [n, 16] (float32):
    per 128 codes, 64 bytes of low nibbles (two planes each) and 32 bytes of 2-bit highs."""
    n = blocks.shape[0]
    low = _split_bits(blocks[:, :128].reshape(n, 2, 64), 4).reshape(n, 2, 4, 32)
    high = _split_bits(blocks[:, 128:192].reshape(n, 2, 32), 2)
    codes = ((low | (high << 4)).view(torch.int8) - 32).reshape(n, QK_K)
    return codes, _f16(blocks, 208) * blocks[:, 192:208].view(torch.int8).float()


def q8_0_codes(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q8_0 blocks [n, 34] as their codes [n, 32] (int8) and scales [n, 1] (float32)."""
    return blocks[:, 2:34].view(torch.int8), _f16(blocks, 0)


# The sixteen non-linear levels of IQ4_NL and IQ4_XS.
IQ4_LEVELS = (-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113)


def _iq4_levels(q: torch.Tensor) -> torch.Tensor:
    levels = torch.tensor(IQ4_LEVELS, dtype=torch.int8, device=q.device)
    return levels[q.int()]


def iq4_nl_codes(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """IQ4_NL blocks [n, 18] as their levels [n, 32] (int8) and scales [n, 1] (float32)."""
    return _iq4_levels(_low_high_nibbles(blocks[:, 2:18])), _f16(blocks, 0)


def iq4_xs_codes(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """IQ4_XS blocks [n, 136] as their levels [n, 256] (int8) and each 32 levels' scale [n, 8] (float32)."""
    n = blocks.shape[0]
    # Eight 6-bit scales: low 4 bits from bytes 4..7 (low then high nibble), top 2 bits from the uint16 at 2.
    low = _split_bits(blocks[:, 4:8], 4).transpose(1, 2).reshape(n, 8)
    high_word = blocks[:, 2:4].contiguous().view(torch.int16).to(torch.int32) & 0xFFFF
    high = (high_word >> (2 * torch.arange(8, device=blocks.device, dtype=torch.int32))) & 3
    scales = (low.to(torch.int32) | (high << 4)) - 32
    codes = _split_bits(blocks[:, 8:136].reshape(n, 8, 16), 4).reshape(n, QK_K)
    return _iq4_levels(codes), _f16(blocks, 0) * scales.float()


def _iq4_nl(b: torch.Tensor) -> torch.Tensor:
    return _scaled_runs(*iq4_nl_codes(b))


def _iq4_xs(b: torch.Tensor) -> torch.Tensor:
    return _scaled_runs(*iq4_xs_codes(b))


_BLOCK_DECODERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    GGMLQuantizationType.Q4_0: _q4_0,
    GGMLQuantizationType.Q4_1: _q4_1,
    GGMLQuantizationType.Q5_0: _q5_0,
    GGMLQuantizationType.Q5_1: _q5_1,
    GGMLQuantizationType.Q8_0: _q8_0,
    GGMLQuantizationType.Q2_K: _q2_k,
    GGMLQuantizationType.Q3_K: _q3_k,
    GGMLQuantizationType.Q4_K: _q4_k,
    GGMLQuantizationType.Q5_K: _q5_k,
    GGMLQuantizationType.Q6_K: _q6_k,
    GGMLQuantizationType.IQ4_NL: _iq4_nl,
    GGMLQuantizationType.IQ4_XS: _iq4_xs,
}

_FLOAT_TYPES = {
    GGMLQuantizationType.F32: torch.float32,
    GGMLQuantizationType.F16: torch.float16,
    GGMLQuantizationType.BF16: torch.bfloat16,
}

# The quantized types (blocks of codes and scales) and every type the loader reads.
BLOCK_TYPES: frozenset[GGMLQuantizationType] = frozenset(_BLOCK_DECODERS)
SUPPORTED_TYPES: frozenset[GGMLQuantizationType] = BLOCK_TYPES | frozenset(_FLOAT_TYPES)


def as_bytes(raw: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of raw, without copying when it is already contiguous."""
    if isinstance(raw, torch.Tensor):
        return raw.contiguous().reshape(-1).view(torch.uint8)
    flat = np.ascontiguousarray(raw).reshape(-1).view(np.uint8)
    with warnings.catch_warnings():
        # GGUFReader hands out read-only memmaps; nothing here writes to them.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(flat)


def dequantize(
    raw: np.ndarray | torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, ...]
) -> torch.Tensor:
    """Decode a GGUF tensor's raw data to a new float32 tensor of the given (torch-order) shape.

    ``raw`` is what ``gguf.GGUFReader`` gives as ``ReaderTensor.data`` (any dtype and shape; only
    its bytes matter), or a torch tensor of those bytes on any device.
    """
    qtype = GGMLQuantizationType(qtype)
    if qtype not in SUPPORTED_TYPES:
        raise NotImplementedError(f"GGUF tensor type {qtype.name} is not supported")
    data = as_bytes(raw)
    numel = int(np.prod(shape))
    block_size, type_size = GGML_QUANT_SIZES[qtype]
    if numel % block_size or data.numel() != numel // block_size * type_size:
        raise ValueError(f"{data.numel()} bytes of {qtype.name} do not hold a tensor of shape {tuple(shape)}")
    if qtype in _FLOAT_TYPES:
        values = data.view(_FLOAT_TYPES[qtype])
        # Always a fresh tensor: raw may be a read-only memmap.
        return values.clone().reshape(shape) if values.dtype == torch.float32 else values.float().reshape(shape)
    blocks = data.reshape(-1, type_size)
    return _BLOCK_DECODERS[qtype](blocks).reshape(shape)
