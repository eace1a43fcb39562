"""GGUF weights on a CPU, repacked once at load for torch's int4 and int8 CPU matmul kernels.

Dequantizing a packed weight in every forward costs several passes over a float32 copy of it (the default
model decoded 4.6 tokens/s so, llama.cpp 79 on the same two cores). Q4_0, Q4_1 and Q4_K are 4-bit codes with
a scale and an offset per 32 weights: the layout of `_weight_int4pack_mm_for_cpu` with groups of 32. Q8_0 is
int8 codes with a scale per 32: one `_weight_int8pack_mm` per group of 32 columns, summed in float32. Both
kernels take bfloat16 inputs, scales and offsets and accumulate in float32, so a result is the file's weights'
up to bfloat16 rounding of those (llama.cpp itself rounds the inputs to 8 bits). Other types keep the
dequantizing path, as does every type with WICK_CPU_QUANT_KERNELS=0 (float32 throughout, slower).
"""

from __future__ import annotations

import os

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from wick.loader.file_pages import release_file_pages
from wick.loader.gguf_dequant import affine_4bit_codes, q8_0_codes

_GROUP = 32
_INT4_TYPES = frozenset({GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q4_K})
CPU_KERNEL_TYPES = _INT4_TYPES | {GGMLQuantizationType.Q8_0}
# Rows converted at once: a bound on the int32 codes the int4 packing takes.
_CONVERT_ROWS = 4096


def _blocks(data: torch.Tensor, qtype: GGMLQuantizationType) -> torch.Tensor:
    return data.reshape(-1, GGML_QUANT_SIZES[qtype][1])


def _flat_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).to(torch.bfloat16)


class Int4Weight:
    """A Q4_0 / Q4_1 / Q4_K weight [rows, columns] in the int4 CPU kernel's layout."""

    def __init__(self, data: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int]) -> None:
        rows, columns = shape
        packed, scales_and_zeros = [], []
        for start in range(0, rows, _CONVERT_ROWS):
            size = min(_CONVERT_ROWS, rows - start)
            codes, scales, offsets = affine_4bit_codes(_blocks(data.narrow(0, start, size), qtype), qtype)
            packed.append(torch.ops.aten._convert_weight_to_int4pack_for_cpu(
                codes.reshape(size, columns).to(torch.int32), 1))
            scales, offsets = scales.reshape(size, -1), offsets.reshape(size, -1)
            # The kernel computes (code - 8) * scale + zero.
            scales_and_zeros.append(torch.stack([scales, offsets + 8 * scales], dim=-1))
        self.packed = torch.cat(packed)
        self.scales_and_zeros = torch.cat(scales_and_zeros).transpose(0, 1).to(torch.bfloat16).contiguous()

    def tensors(self) -> list[torch.Tensor]:
        return [self.packed, self.scales_and_zeros]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(_flat_bf16(x), self.packed, _GROUP, self.scales_and_zeros)
        return out.to(x.dtype).reshape(*x.shape[:-1], -1)


class Int8Weight:
    """A Q8_0 weight [rows, columns] as int8 codes [columns / 32, rows, 32] and scales [columns / 32, rows]."""

    def __init__(self, data: torch.Tensor, qtype: GGMLQuantizationType, shape: tuple[int, int]) -> None:
        rows, columns = shape
        codes, scales = q8_0_codes(_blocks(data, qtype))
        # One copy of the codes, straight from the blocks into [groups, rows, 32].
        self.codes = codes.view(rows, columns // _GROUP, _GROUP).transpose(0, 1).contiguous()
        self.scales = scales.reshape(rows, -1).t().to(torch.bfloat16).contiguous()

    def tensors(self) -> list[torch.Tensor]:
        return [self.codes, self.scales]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        flat = _flat_bf16(x)
        groups = flat.view(flat.shape[0], -1, _GROUP).transpose(0, 1).contiguous()
        out = torch.zeros(flat.shape[0], self.codes.shape[1], dtype=torch.float32)
        for group, codes, scales in zip(groups, self.codes, self.scales, strict=True):
            out += torch.ops.aten._weight_int8pack_mm(group, codes, scales)
        return out.to(x.dtype).reshape(*x.shape[:-1], -1)


def cpu_kernel_weight(data: torch.Tensor, qtype: GGMLQuantizationType,
                      shape: tuple[int, int]) -> Int4Weight | Int8Weight | None:
    """The weight in a CPU kernel's layout, if it is on the CPU and its type has a kernel."""
    if data.device.type != "cpu" or qtype not in CPU_KERNEL_TYPES or os.environ.get("WICK_CPU_QUANT_KERNELS") == "0":
        return None
    if qtype in _INT4_TYPES:
        # The int4 packing takes whole tiles of 16 rows.
        if shape[0] % 16:
            return None
        weight = Int4Weight(data, qtype, shape)
    else:
        weight = Int8Weight(data, qtype, shape)
    release_file_pages(data)
    return weight
