"""GGUF weights on a CPU, repacked once at load for torch's int4 and int8 CPU matmul kernels.

Dequantizing a packed weight in every forward costs several passes over a float32 copy of it (the default
model decoded 4.6 tokens/s so, llama.cpp 79 on the same two cores). Q4_0, Q4_1 and Q4_K are 4-bit codes with
a scale and an offset per 32 weights: the layout of `_weight_int4pack_mm_for_cpu` with groups of 32. Q5_0, Q5_1
and Q5_K are 5-bit codes so, and Q8_0 8-bit ones (its signed codes + 128): two such weights, one of the codes' low
four bits and one of the rest (times 16), whose products are added (Qwen2.5-Coder-0.5B's Q4_K_M file holds most of
its weights in Q5_0). Where the int4 tiles do not fit a weight's rows, Q8_0 is int8 codes with a scale per 32: one
`_weight_int8pack_mm` per group of 32 columns, summed in float32 (a fifth as fast); IQ4_NL and IQ4_XS so too,
their codes the sixteen non-linear levels (int8, 8 bits a weight where the file has 4.5-4.25); Q6_K is 6-bit
codes (int8) with a scale per 16, eight of its runs of 16 a call of the same kernel (Int8Weight). Both kernels
take bfloat16 inputs, scales and offsets and accumulate in float32, so a result is the file's weights' up to
bfloat16 rounding of those (llama.cpp itself rounds the inputs to 8 bits). For a prompt's rows of x, an int8
weight makes float32 rows of the weight a chunk at a time instead, which x multiplies in float32: the int8 calls'
cost grows with x's rows. Q2_K and Q3_K keep the dequantizing path (as int8 codes they would take 3 and 2.3 times
their file's bytes), as does every type with WICK_CPU_QUANT_KERNELS=0 (float32 throughout, slower).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from wick.loader.file_pages import release_file_pages
from wick.loader.gguf_dequant import affine_codes, iq4_nl_codes, iq4_xs_codes, q6_k_codes, q8_0_codes

_GROUP = 32
_FIVE_BIT_TYPES = frozenset({GGMLQuantizationType.Q5_0, GGMLQuantizationType.Q5_1, GGMLQuantizationType.Q5_K})
_TWO_PLANE_TYPES = _FIVE_BIT_TYPES | {GGMLQuantizationType.Q8_0}
_INT4_TYPES = _TWO_PLANE_TYPES | {GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_K}
# Types of int8 codes with a scale a run of columns: their blocks' codes and scales; and (run, runs an Int8Weight
# call, rows of x from which it multiplies by its rows in float32 instead), where not (32, 1, 16). The kernel makes a
# call a run of 32, or of 8 runs of 16 as 8 rows of x each, and past a few rows of x its calls take longer than
# dequantizing (benchmarks/cpu_gguf_linear.py).
_INT8_CODES = {GGMLQuantizationType.Q8_0: q8_0_codes, GGMLQuantizationType.IQ4_NL: iq4_nl_codes,
               GGMLQuantizationType.IQ4_XS: iq4_xs_codes, GGMLQuantizationType.Q6_K: q6_k_codes}
_INT8_RUNS = {GGMLQuantizationType.Q6_K: (16, 8, 8)}
CPU_KERNEL_TYPES = _INT4_TYPES | frozenset(_INT8_CODES)
# The float32 rows an Int8Weight makes at once.
_DEQUANT_CHUNK_BYTES = 16 << 20
# Rows converted at once (whole tiles of 64, see Int4Weight.takes): a bound on the int32 codes the packing takes.
_CONVERT_ROWS = 4096


def _blocks(data: torch.Tensor, qtype: GGMLQuantizationType) -> torch.Tensor:
    return data.reshape(-1, GGML_QUANT_SIZES[qtype][1])


def _flat_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).to(torch.bfloat16)


# A packed block of rows as stored: [rows, row bytes] of uint8, its type, (rows, columns).
Piece = tuple[torch.Tensor, GGMLQuantizationType, tuple[int, int]]


class Int4Weight:
    """Q4_0 / Q4_1 / Q4_K / Q5_0 / Q5_1 / Q5_K / Q8_0 pieces, their rows stacked, in the int4 CPU kernel's layout: one
    weight of the codes, or where a piece has 5- or 8-bit codes two, of the low four bits and of the rest."""

    def __init__(self, pieces: list[Piece]) -> None:
        planes = 2 if any(qtype in _TWO_PLANE_TYPES for _, qtype, _ in pieces) else 1
        packed: list[list[torch.Tensor]] = [[] for _ in range(planes)]
        scales_and_zeros: list[list[torch.Tensor]] = [[] for _ in range(planes)]
        for data, qtype, (rows, columns) in pieces:
            for start in range(0, rows, _CONVERT_ROWS):
                size = min(_CONVERT_ROWS, rows - start)
                codes, scales, offsets = affine_codes(_blocks(data.narrow(0, start, size), qtype), qtype)
                codes = codes.reshape(size, columns).to(torch.int32)
                scales, offsets = scales.reshape(size, -1), offsets.reshape(size, -1)
                # code * scale + offset = (code & 15) * scale + (code >> 4) * 16 * scale + offset, the offset split
                # so that each plane's zero (below) is a power of two times its scale, exact in bfloat16 as the scale
                # is. Q8_0's planes are centred (zeros 0 and 8 x scale), as each plane's sum is rounded to bfloat16.
                low_offsets, high_offsets = offsets, torch.zeros_like(offsets)
                if qtype == GGMLQuantizationType.Q8_0:
                    low_offsets = scales * -8
                    high_offsets = offsets - low_offsets
                parts = [(codes & 15, scales, low_offsets), (codes >> 4, scales * 16, high_offsets)]
                for plane, (plane_codes, plane_scales, plane_offsets) in enumerate(parts[:planes]):
                    packed[plane].append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(plane_codes, 1))
                    # The kernel computes (code - 8) * scale + zero.
                    scales_and_zeros[plane].append(torch.stack([plane_scales, plane_offsets + 8 * plane_scales],
                                                               dim=-1))
        self.packed = [torch.cat(plane) for plane in packed]
        self.scales_and_zeros = [torch.cat(plane).transpose(0, 1).to(torch.bfloat16).contiguous()
                                 for plane in scales_and_zeros]

    @staticmethod
    def takes(pieces: list[Piece]) -> bool:
        # The packing works in tiles of 16 rows and interleaves rows within 64: packed pieces stack when every
        # piece but the last is whole tiles of 64.
        rows = [shape[0] for _, _, shape in pieces]
        return rows[-1] % 16 == 0 and all(r % 64 == 0 for r in rows[:-1])

    def tensors(self) -> list[torch.Tensor]:
        return [*self.packed, *self.scales_and_zeros]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = _flat_bf16(x)
        out = None
        for packed, scales_and_zeros in zip(self.packed, self.scales_and_zeros, strict=True):
            plane = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, packed, _GROUP, scales_and_zeros).float()
            out = plane if out is None else out.add_(plane)
        return out.to(x.dtype).reshape(*x.shape[:-1], -1)


class Int8Weight:
    """Q8_0, IQ4_NL and IQ4_XS pieces (IQ4's codes are their levels, -127..113), or Q6_K pieces, their rows stacked,
    as int8 codes with a scale a run of `run` columns (32, or 16 for Q6_K), taken `runs` runs a call: codes [calls,
    rows, run * runs], scales [calls, runs, rows]. A call of runs of 32 is one run, its scales applied by the
    kernel. A Q6_K call takes 8 runs of 16, x's runs the rows of a block-diagonal input, each run's product scaled
    afterwards: for a 896 x 4864 weight on the 2-core CI machine a call a run took 4.1 ms and 8 runs a call 2.5 (one
    run of a script); dequantized, about 11 ms a layer in a decode profile. From `kernel_rows` rows of x on (a
    prompt's), the codes become float32 rows of the weight, a chunk at a time, and x multiplies those."""

    def __init__(self, pieces: list[Piece]) -> None:
        self.run, self.runs, self.kernel_rows = _INT8_RUNS.get(pieces[0][1], (_GROUP, 1, 16))
        width = self.run * self.runs
        codes, scales = [], []
        for data, qtype, (rows, columns) in pieces:
            piece_codes, piece_scales = _INT8_CODES[qtype](_blocks(data, qtype))
            # One copy of the codes, straight from the blocks into [calls, rows, width].
            codes.append(piece_codes.reshape(rows, columns // width, width).transpose(0, 1))
            scales.append(piece_scales.reshape(rows, -1, self.runs).permute(1, 2, 0))
        self.codes = torch.cat(codes, dim=1)
        self.scales = torch.cat(scales, dim=2).to(torch.bfloat16).contiguous()
        # Runs of 16 are scaled after the kernel, which takes scales of 1 (a call of a run of 32 takes its own).
        self.ones = torch.ones(self.codes.shape[1], dtype=torch.bfloat16) if self.runs > 1 else None

    @staticmethod
    def takes(pieces: list[Piece]) -> bool:
        qtypes = {qtype for _, qtype, _ in pieces}
        return qtypes <= _INT8_CODES.keys() and len({_INT8_RUNS.get(qtype) for qtype in qtypes}) == 1

    def tensors(self) -> list[torch.Tensor]:
        return [self.codes, self.scales]

    def dequantized(self, start: int, size: int) -> torch.Tensor:
        """Rows [start, start + size) of the weight in float32: [size, columns]."""
        calls = len(self.codes)
        weight = torch.empty(size, calls, self.runs, self.run)
        weight.copy_(self.codes[:, start:start + size].view(calls, size, self.runs, self.run).permute(1, 0, 2, 3))
        return weight.mul_(self.scales[:, :, start:start + size].permute(2, 0, 1).unsqueeze(-1)).view(size, -1)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() // x.shape[-1] >= self.kernel_rows:
            return float_rows_product(x, self.codes.shape[1], _DEQUANT_CHUNK_BYTES, self.dequantized)
        flat = _flat_bf16(x)
        m = flat.shape[0]
        runs = flat.view(m, len(self.codes), self.runs, self.run).transpose(0, 1)
        if self.runs == 1:
            partial = torch.stack([torch.ops.aten._weight_int8pack_mm(call_x.reshape(m, self.run), codes, scales[0])
                                   for call_x, codes, scales in zip(runs, self.codes, self.scales, strict=True)])
            out = partial.sum(0, dtype=torch.float32)
        else:
            diagonal = torch.eye(self.runs, dtype=flat.dtype)[:, :, None]
            out = torch.zeros(m, self.codes.shape[1])
            for call_x, codes, scales in zip(runs, self.codes, self.scales, strict=True):
                block_x = (call_x[:, :, None, :] * diagonal).reshape(m * self.runs, -1)
                product = torch.ops.aten._weight_int8pack_mm(block_x, codes, self.ones).view(m, self.runs, -1)
                out += (product.float() * scales.float()).sum(1)
        return out.to(x.dtype).reshape(*x.shape[:-1], -1)


def float_rows_product(x: torch.Tensor, rows: int, chunk_bytes: int,
                       float_rows: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """x [..., columns] @ W^T in x's dtype, W's rows [start, start + size) made by float_rows(start, size) in chunks
    of at most chunk_bytes of float32."""
    chunk = max(1, chunk_bytes // (4 * x.shape[-1]))
    if rows <= chunk:
        return x @ float_rows(0, rows).to(x.dtype).t()
    out = x.new_empty(*x.shape[:-1], rows)
    for start in range(0, rows, chunk):
        size = min(chunk, rows - start)
        out[..., start:start + size] = x @ float_rows(start, size).to(x.dtype).t()
    return out


def cpu_kernel_weight(pieces: list[Piece], logits: bool = False) -> Int4Weight | Int8Weight | None:
    """One CPU kernel weight over the pieces' stacked rows, if they are on the CPU and one kernel takes them all.

    logits: the weight is an LM head's, whose outputs are ranked against each other. Its Q8_0 keeps the int8 kernel,
    whose products of each run of 32 add up in float32: the int4 kernel rounds each plane's whole sum to bfloat16,
    0.125 apart at logits of 16 to 32, which swapped near-ties of the default model's head in a test."""
    if os.environ.get("WICK_CPU_QUANT_KERNELS") == "0" or any(data.device.type != "cpu" for data, _, _ in pieces):
        return None
    qtypes = {qtype for _, qtype, _ in pieces}
    int4_types = _INT4_TYPES - {GGMLQuantizationType.Q8_0} if logits else _INT4_TYPES
    if qtypes <= int4_types and Int4Weight.takes(pieces):
        weight: Int4Weight | Int8Weight = Int4Weight(pieces)
    elif Int8Weight.takes(pieces):
        weight = Int8Weight(pieces)
    else:
        return None
    for data, _, _ in pieces:
        release_file_pages(data)
    return weight
