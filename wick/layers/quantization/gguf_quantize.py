"""Round-to-nearest quantization of float weights into GGUF blocks, in torch (so on the GPU when
the weights are there). The byte layouts are llama.cpp's, read back by wick/loader/gguf_dequant.py;
the scales are plain min/max fits, not llama.cpp's searched ones.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType


def _f16_bytes(x: torch.Tensor) -> torch.Tensor:
    """[n] floats -> [n, 2] bytes of their float16 values."""
    return x.to(torch.float16).reshape(-1, 1).view(torch.uint8)


def _inverse(scale: torch.Tensor) -> torch.Tensor:
    return torch.where(scale == 0, torch.zeros_like(scale), 1.0 / scale)


def _nibbles(low: torch.Tensor, high: torch.Tensor) -> torch.Tensor:
    return (low | (high << 4)).to(torch.uint8)


def _bits_to_bytes(bits: torch.Tensor) -> torch.Tensor:
    """[..., 8, L] of 0/1 -> [..., L] bytes with bit k from row k."""
    shifts = torch.arange(8, device=bits.device).reshape(8, 1)
    return (bits.to(torch.int32) << shifts).sum(-2).to(torch.uint8)


def _signed_max(x: torch.Tensor) -> torch.Tensor:
    """Per row, the entry of largest magnitude with its sign."""
    return x.gather(-1, x.abs().argmax(-1, keepdim=True)).squeeze(-1)


def _q8_0(x: torch.Tensor) -> torch.Tensor:
    d = x.abs().amax(-1) / 127
    q = (x * _inverse(d)[:, None]).round().clamp(-127, 127).to(torch.int8).view(torch.uint8)
    return torch.cat([_f16_bytes(d), q], dim=1)


def _q4_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_max(x) / -8
    q = (x * _inverse(d)[:, None] + 8.5).trunc().clamp(0, 15).to(torch.int32)
    return torch.cat([_f16_bytes(d), _nibbles(q[:, :16], q[:, 16:])], dim=1)


def _q4_1(x: torch.Tensor) -> torch.Tensor:
    low, high = x.amin(-1), x.amax(-1)
    d = (high - low) / 15
    q = ((x - low[:, None]) * _inverse(d)[:, None] + 0.5).trunc().clamp(0, 15).to(torch.int32)
    return torch.cat([_f16_bytes(d), _f16_bytes(low), _nibbles(q[:, :16], q[:, 16:])], dim=1)


def _fifth_bits(q: torch.Tensor) -> torch.Tensor:
    """Bit 4 of each of 32 values as a little-endian uint32: [n, 4] bytes."""
    return _bits_to_bytes(((q >> 4) & 1).reshape(-1, 4, 8).transpose(1, 2))


def _q5_0(x: torch.Tensor) -> torch.Tensor:
    d = _signed_max(x) / -16
    q = (x * _inverse(d)[:, None] + 16.5).trunc().clamp(0, 31).to(torch.int32)
    return torch.cat([_f16_bytes(d), _fifth_bits(q), _nibbles(q[:, :16] & 15, q[:, 16:] & 15)], dim=1)


def _q5_1(x: torch.Tensor) -> torch.Tensor:
    low, high = x.amin(-1), x.amax(-1)
    d = (high - low) / 31
    q = ((x - low[:, None]) * _inverse(d)[:, None] + 0.5).trunc().clamp(0, 31).to(torch.int32)
    return torch.cat([_f16_bytes(d), _f16_bytes(low), _fifth_bits(q),
                      _nibbles(q[:, :16] & 15, q[:, 16:] & 15)], dim=1)


def _affine_subblocks(x: torch.Tensor, levels: int, scale_levels: int) -> tuple[torch.Tensor, ...]:
    """Fit x ~ d * sc * q - dmin * m per sub-block (x: [n, subblocks, size]) with q in [0, levels],
    sc and m integers in [0, scale_levels]; returns (d, dmin, sc, m, q) with q of shape x.shape."""
    low = x.amin(-1).clamp(max=0)
    scale = (x.amax(-1) - low) / levels
    d = scale.amax(-1) / scale_levels
    dmin = (-low).amax(-1) / scale_levels
    sc = (scale * _inverse(d)[:, None]).round().clamp(0, scale_levels)
    m = (-low * _inverse(dmin)[:, None]).round().clamp(0, scale_levels)
    d16, dmin16 = d.half().float(), dmin.half().float()
    step = d16[:, None] * sc
    q = ((x + (dmin16[:, None] * m)[..., None]) * _inverse(step)[..., None]).round().clamp(0, levels)
    return d, dmin, sc.to(torch.int32), m.to(torch.int32), q.to(torch.int32)


def _k_scale_bytes(sc: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """Eight 6-bit scales and mins -> the 12 bytes of a Q4_K / Q5_K block."""
    a = sc[:, :4] | ((sc[:, 4:] >> 4) << 6)
    b = m[:, :4] | ((m[:, 4:] >> 4) << 6)
    c = (sc[:, 4:] & 15) | ((m[:, 4:] & 15) << 4)
    return torch.cat([a, b, c], dim=1).to(torch.uint8)


def _q4_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    d, dmin, sc, m, q = _affine_subblocks(x.reshape(n, 8, 32), 15, 63)
    qs = _nibbles(q[:, 0::2], q[:, 1::2]).reshape(n, 128)
    return torch.cat([_f16_bytes(d), _f16_bytes(dmin), _k_scale_bytes(sc, m), qs], dim=1)


def _q5_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    d, dmin, sc, m, q = _affine_subblocks(x.reshape(n, 8, 32), 31, 63)
    qh = _bits_to_bytes((q >> 4) & 1)
    qs = _nibbles(q[:, 0::2] & 15, q[:, 1::2] & 15).reshape(n, 128)
    return torch.cat([_f16_bytes(d), _f16_bytes(dmin), _k_scale_bytes(sc, m), qh, qs], dim=1)


def _q2_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    d, dmin, sc, m, q = _affine_subblocks(x.reshape(n, 16, 16), 3, 15)
    planes = q.reshape(n, 2, 4, 32)
    qs = (planes << (2 * torch.arange(4, device=x.device)).reshape(4, 1)).sum(2).reshape(n, 64)
    return torch.cat([(sc | (m << 4)).to(torch.uint8), qs.to(torch.uint8), _f16_bytes(d), _f16_bytes(dmin)], dim=1)


def _symmetric_subblocks(x: torch.Tensor, qmin: int, qmax: int, smax: int) -> tuple[torch.Tensor, ...]:
    """Fit x ~ d * sc * q per sub-block, q in [qmin, qmax], sc in [-smax, smax]: (d, sc, q)."""
    scale = x.abs().amax(-1) / qmax
    d = scale.amax(-1) / smax
    sc = (scale * _inverse(d)[:, None]).round().clamp(-smax, smax)
    step = d.half().float()[:, None] * sc
    q = (x * _inverse(step)[..., None]).round().clamp(qmin, qmax)
    return d, sc.to(torch.int32), q.to(torch.int32)


def _q3_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    d, sc, q = _symmetric_subblocks(x.reshape(n, 16, 16), -4, 3, 31)
    u = (q + 4).reshape(n, 2, 4, 32)
    hmask = _bits_to_bytes((u >> 2).reshape(n, 8, 32))
    qs = ((u & 3) << (2 * torch.arange(4, device=x.device)).reshape(4, 1)).sum(2).reshape(n, 64)
    s = sc + 32
    low = (s[:, :8] & 15) | ((s[:, 8:] & 15) << 4)
    high = ((s >> 4).reshape(n, 4, 4) << (2 * torch.arange(4, device=x.device)).reshape(4, 1)).sum(1)
    return torch.cat([hmask, qs.to(torch.uint8), low.to(torch.uint8), high.to(torch.uint8), _f16_bytes(d)], dim=1)


def _q6_k(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    d, sc, q = _symmetric_subblocks(x.reshape(n, 16, 16), -32, 31, 127)
    u = (q + 32).reshape(n, 2, 4, 32)
    low = u & 15
    ql = torch.cat([_nibbles(low[:, :, 0], low[:, :, 2]), _nibbles(low[:, :, 1], low[:, :, 3])], dim=2)
    qh = ((u >> 4) << (2 * torch.arange(4, device=x.device)).reshape(4, 1)).sum(2)
    return torch.cat([ql.reshape(n, 128), qh.reshape(n, 64).to(torch.uint8),
                      sc.to(torch.int8).view(torch.uint8), _f16_bytes(d)], dim=1)


_ENCODERS: dict[GGMLQuantizationType, Callable[[torch.Tensor], torch.Tensor]] = {
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0,
    T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k,
}
QUANTIZABLE_TYPES = frozenset(_ENCODERS)


def quantize(weight: torch.Tensor, qtype: GGMLQuantizationType) -> torch.Tensor:
    """A [rows, columns] float tensor -> [rows, row bytes] uint8 of `qtype` blocks, on its device."""
    if qtype not in _ENCODERS:
        raise NotImplementedError(f"quantizing to {qtype.name} is not supported")
    block, type_size = GGML_QUANT_SIZES[qtype]
    rows, columns = weight.shape
    if columns % block:
        raise ValueError(f"{qtype.name} needs rows of a multiple of {block} values, not {columns}")
    blocks = weight.detach().float().reshape(-1, block)
    packed = _ENCODERS[qtype](blocks)
    assert packed.shape[1] == type_size
    return packed.reshape(rows, columns // block * type_size)
