"""AWQ checkpoints (config.json quant_method "awq", GEMM version): 4-bit weights packed eight to an
int32 along the output dimension in AWQ's interleaved order, with packed zero points and fp16 group
scales. At load the words are reordered into the GPTQ-style layout of the W4A16 kernel, so no
conversion step is asked of the user.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from wick.kernels.wna16_matmul import pack_rows
from wick.layers.pending_norm import PendingRow
from wick.layers.quantization.base import LinearMethod, QuantizationConfig, set_weight_attrs
from wick.layers.quantization.gptq import (
    apply_wna16,
    fill_dummy_wna16,
    finish_wna16,
    unpack_columns,
    wna16_held_tensors,
)

# Field i of an AWQ word holds column AWQ_ORDER[i] of its eight.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_BITS = 4
_PACK = 8


class AWQConfig(QuantizationConfig):
    name = "awq"
    int8_activations = True

    def __init__(self, group_size: int, zero_point: bool) -> None:
        self.group_size = group_size
        self.zero_point = zero_point

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AWQConfig:
        bits = config.get("bits", config.get("w_bit"))
        if bits != 4:
            raise ValueError(f"AWQ quantization_config: only 4-bit weights are supported, got bits={bits!r}")
        version = str(config.get("version", "gemm")).lower()
        if version != "gemm":
            raise ValueError(f"AWQ quantization_config: version {version!r} is not supported; supported: gemm")
        group_size = config.get("group_size", config.get("q_group_size", 128))
        if not isinstance(group_size, int) or (group_size != -1 and group_size <= 0):
            raise ValueError(f"AWQ quantization_config: group_size must be positive or -1, got {group_size!r}")
        return cls(group_size, bool(config.get("zero_point", True)))

    def get_linear_method(self) -> LinearMethod:
        return AWQLinearMethod(self)

    def describe(self) -> str:
        return f"AWQ 4-bit g{self.group_size}"


def awq_unpack(packed: torch.Tensor) -> torch.Tensor:
    """int32 [rows, N / 8] in AWQ's order -> int32 [rows, N]."""
    fields = unpack_columns(packed, _BITS).reshape(packed.shape[0], -1, _PACK)
    columns = torch.empty_like(fields)
    columns[..., list(AWQ_ORDER)] = fields
    return columns.reshape(packed.shape[0], -1)


class AWQLinearMethod(LinearMethod):
    reads_pending_norm = True
    reads_pending_rows = True

    def __init__(self, config: AWQConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        output_size = sum(output_sizes)
        group = self.config.group_size if self.config.group_size != -1 else input_size * layer.tp_size
        if output_size % _PACK or input_size % _PACK:
            raise ValueError(f"AWQ needs layer sizes divisible by 8, got {input_size} x {output_size}")
        per_channel = self.config.group_size == -1
        groups = 1 if per_channel else -(-input_size // group)
        group_attrs: dict[str, Any] = {} if per_channel else {"input_dim": 0, "input_pack": group}

        def param(shape: tuple[int, ...], dtype: torch.dtype, **attrs: Any) -> nn.Parameter:
            return set_weight_attrs(nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False), **attrs)

        layer.register_parameter("qweight", param((input_size, output_size // _PACK), torch.int32,
                                                  input_dim=0, output_dim=1, output_pack=_PACK))
        layer.register_parameter("qzeros", param((groups, output_size // _PACK), torch.int32,
                                                 output_dim=1, output_pack=_PACK, **group_attrs))
        layer.register_parameter("scales", param((groups, output_size), torch.float16, output_dim=1, **group_attrs))
        layer.wna16_dtype = params_dtype
        layer.wna16_group = group

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        values = awq_unpack(layer.qweight.data)
        layer.qweight.data = pack_rows(values, _BITS)
        zeros = awq_unpack(layer.qzeros.data) if self.config.zero_point else torch.zeros_like(layer.scales.data)
        groups = torch.arange(values.shape[0], device=values.device, dtype=torch.int32) // layer.wna16_group
        layer.g_idx = groups.clamp_(max=layer.scales.shape[0] - 1)
        finish_wna16(layer, zeros, _BITS)

    def initialize_dummy(self, layer: nn.Module, generator: torch.Generator, low: float, high: float) -> None:
        fill_dummy_wna16(layer.qweight.data, layer.scales.data, generator, _BITS, high)
        layer.qzeros.data.fill_(0x88888888 - (1 << 32))

    def held_tensors(self, layer: nn.Module) -> list[torch.Tensor]:
        return [layer.g_idx, *wna16_held_tensors(layer)]

    def apply(self, layer: nn.Module, x: torch.Tensor | PendingRow, bias: torch.Tensor | None
              ) -> torch.Tensor:
        return apply_wna16(layer, x, bias)
