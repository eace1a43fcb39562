"""GPTQ checkpoints (config.json quant_method "gptq"): 4- or 8-bit weights in int32 words along the
input dimension, fp16 group scales, packed zero points, g_idx for act-order (desc_act) checkpoints.

The published (v1) layout stores each zero point minus one; `checkpoint_format: gptq_v2` does not.
At load the zero points are unpacked to values; the weights stay packed and run through the
W4A16 / W8A16 Triton kernel on a GPU, or are dequantized per forward elsewhere.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from wick.kernels.wna16_matmul import (
    WNA16_GEMV_CONFIG,
    pack_rows,
    takes_int8_activations,
    unpack_rows,
    wna16_dequantize,
)
from wick.layers.pending_norm import PendingRow, resolved
from wick.layers.quantization.base import DEQUANTIZE_MIN_ROWS, LinearMethod, QuantizationConfig, set_weight_attrs


class GPTQConfig(QuantizationConfig):
    name = "gptq"
    int8_activations = True

    def __init__(self, bits: int, group_size: int, desc_act: bool, sym: bool, zero_offset: int) -> None:
        self.bits = bits
        self.group_size = group_size
        self.desc_act = desc_act
        self.sym = sym
        self.zero_offset = zero_offset

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> GPTQConfig:
        bits = config.get("bits")
        if bits not in (4, 8):
            raise ValueError(f"GPTQ quantization_config: bits must be 4 or 8, got {bits!r}")
        group_size = config.get("group_size", -1)
        if not isinstance(group_size, int) or (group_size != -1 and group_size <= 0):
            raise ValueError(f"GPTQ quantization_config: group_size must be positive or -1, got {group_size!r}")
        checkpoint_format = config.get("checkpoint_format", "gptq")
        if checkpoint_format not in ("gptq", "gptq_v2"):
            raise ValueError(f"GPTQ quantization_config: checkpoint_format {checkpoint_format!r} is not supported; "
                             "supported: gptq, gptq_v2")
        return cls(bits, group_size, bool(config.get("desc_act", False)), bool(config.get("sym", True)),
                   1 if checkpoint_format == "gptq" else 0)

    def get_linear_method(self) -> LinearMethod:
        return GPTQLinearMethod(self)

    def describe(self) -> str:
        group = "per channel" if self.group_size == -1 else f"g{self.group_size}"
        return f"GPTQ {self.bits}-bit {group}{' act-order' if self.desc_act else ''}"


class GPTQLinearMethod(LinearMethod):
    reads_pending_norm = True
    reads_pending_rows = True

    def __init__(self, config: GPTQConfig) -> None:
        self.config = config

    def create_weights(self, layer: nn.Module, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        cfg = self.config
        pack = 32 // cfg.bits
        output_size = sum(output_sizes)
        group = cfg.group_size if cfg.group_size != -1 else input_size * layer.tp_size
        if input_size % pack or output_size % pack:
            raise ValueError(f"GPTQ {cfg.bits}-bit needs layer sizes divisible by {pack}, "
                             f"got {input_size} x {output_size}")
        # Act-order groups are scattered over the input rows: a rank of a row-split layer needs them all.
        full_groups = cfg.group_size == -1 or (cfg.desc_act and layer.input_is_sharded)
        groups = -(-input_size * layer.tp_size // group) if full_groups else -(-input_size // group)
        group_attrs: dict[str, Any] = {} if full_groups else {"input_dim": 0, "input_pack": group}

        def param(shape: tuple[int, ...], dtype: torch.dtype, **attrs: Any) -> nn.Parameter:
            return set_weight_attrs(nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False), **attrs)

        layer.register_parameter("qweight", param((input_size // pack, output_size), torch.int32,
                                                  input_dim=0, input_pack=pack, output_dim=1))
        layer.register_parameter("qzeros", param((groups, output_size // pack), torch.int32,
                                                 output_dim=1, output_pack=pack, **group_attrs))
        layer.register_parameter("scales", param((groups, output_size), torch.float16, output_dim=1, **group_attrs))
        # Checkpoints without act-order may leave g_idx out; it is then rows // group.
        layer.register_parameter("g_idx", param((input_size,), torch.int32, input_dim=0, optional=not cfg.desc_act))
        layer.wna16_dtype = params_dtype
        layer.wna16_group = group

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if not self.config.desc_act:
            rows = torch.arange(layer.g_idx.numel(), device=layer.g_idx.device, dtype=torch.int32)
            layer.g_idx.data = rows // layer.wna16_group if self.config.group_size != -1 else rows * 0
        zeros = unpack_columns(layer.qzeros.data, self.config.bits) + self.config.zero_offset
        finish_wna16(layer, zeros, self.config.bits)

    def initialize_dummy(self, layer: nn.Module, generator: torch.Generator, low: float, high: float) -> None:
        fill_dummy_wna16(layer.qweight.data, layer.scales.data, generator, self.config.bits, high)
        center = 1 << (self.config.bits - 1)
        layer.qzeros.data.fill_(splat(center - self.config.zero_offset, self.config.bits))
        if self.config.group_size == -1 or layer.g_idx.numel() == 0:
            layer.g_idx.data.zero_()
        else:
            layer.g_idx.data.copy_(torch.arange(layer.g_idx.numel(), device=layer.g_idx.device) // layer.wna16_group
                                   % layer.scales.shape[0])

    def held_tensors(self, layer: nn.Module) -> list[torch.Tensor]:
        return wna16_held_tensors(layer)

    def apply(self, layer: nn.Module, x: torch.Tensor | PendingRow, bias: torch.Tensor | None
              ) -> torch.Tensor:
        return apply_wna16(layer, x, bias)


def unpack_columns(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [rows, N / pack] -> int32 [rows, N], lowest bits first."""
    return unpack_rows(packed.t().contiguous(), bits).t().contiguous()


def finish_wna16(layer: nn.Module, zeros: torch.Tensor, bits: int) -> None:
    """Keep the packed weights, scales and zero points in the layout of the W4A16 / W8A16 kernel.

    Act-order rows are sorted by group (the input's columns are permuted to match per forward, as
    exllama does), so that each group's rows are contiguous and the GEMV reads one scale per word."""
    layer.wna16_bits = bits
    layer.scales.data = layer.scales.data.to(layer.wna16_dtype)
    layer.wna16_zeros = zeros.to(layer.wna16_dtype)
    layer.wna16_perm = None
    g_idx = layer.g_idx.data
    group = layer.wna16_group
    contiguous = torch.arange(g_idx.numel(), device=g_idx.device, dtype=g_idx.dtype) // group
    if not torch.equal(g_idx, contiguous):
        perm = torch.argsort(g_idx, stable=True)
        if torch.equal(g_idx[perm], contiguous):
            layer.qweight.data = pack_rows(unpack_rows(layer.qweight.data, bits)[perm], bits)
            layer.g_idx.data = contiguous
            layer.wna16_perm = perm
    layer.wna16_contiguous_group = group if torch.equal(layer.g_idx.data, contiguous) and group % (32 // bits) == 0 \
        else None


def wna16_held_tensors(layer: nn.Module) -> list[torch.Tensor]:
    """What the W4A16 / W8A16 layout holds beside the layer's parameters."""
    return [layer.wna16_zeros] + ([layer.wna16_perm] if layer.wna16_perm is not None else [])


def _takes_int8_rows(layer: nn.Module, k: int) -> bool:
    """Whether a row reaching the layer on the GPU takes the int8 GEMV, its columns in order."""
    group = layer.wna16_contiguous_group
    return (layer.wna16_perm is None and group is not None and layer.qweight.is_cuda
            and takes_int8_activations(layer.wna16_bits, group, k, WNA16_GEMV_CONFIG[1]))


def apply_wna16(layer: nn.Module, x: torch.Tensor | PendingRow, bias: torch.Tensor | None
                ) -> torch.Tensor:
    """x @ W (+ bias). A pending row (a norm's, an activation's, a split attention's) that the int8 GEMV reads
    reaches it rounded by the kernel that makes it."""
    if isinstance(x, PendingRow) and _takes_int8_rows(layer, x.columns):
        from wick.kernels.wna16_matmul import wna16_int8_rows_matmul

        out = wna16_int8_rows_matmul(x.int8_rows(interleave=True), layer.qweight, layer.scales, layer.wna16_zeros,
                                     layer.wna16_bits, layer.wna16_contiguous_group, x.dtype)
        return out + bias if bias is not None else out
    x = resolved(x)
    if layer.wna16_perm is not None:
        x = x.index_select(-1, layer.wna16_perm)
    if x.is_cuda and x.numel() < DEQUANTIZE_MIN_ROWS * x.shape[-1]:
        from wick.kernels.wna16_matmul import wna16_matmul

        out = wna16_matmul(x, layer.qweight, layer.scales, layer.wna16_zeros, layer.g_idx, layer.wna16_bits,
                           group=layer.wna16_contiguous_group)
    else:
        if x.is_cuda:
            from wick.kernels.wna16_matmul import wna16_dequantize_triton as dequantize
        else:
            dequantize = wna16_dequantize
        weight = dequantize(layer.qweight, layer.scales, layer.wna16_zeros, layer.g_idx, layer.wna16_bits)
        out = x @ weight.to(x.dtype)
    return out + bias if bias is not None else out


def splat(value: int, bits: int) -> int:
    """An int32 word holding `value` in every field."""
    word = 0
    for shift in range(0, 32, bits):
        word |= value << shift
    return word - (1 << 32) if word >= 1 << 31 else word


def fill_dummy_wna16(qweight: torch.Tensor, scales: torch.Tensor, generator: torch.Generator, bits: int,
                     high: float) -> None:
    """Random packed words and scales that put the dequantized weights within about [-high, high] (with zero points
    at the middle value)."""
    qweight.copy_(torch.randint(-(1 << 31), 1 << 31, qweight.shape, generator=generator, device=qweight.device,
                                dtype=torch.int64).to(torch.int32))
    scales.fill_(high / (1 << (bits - 1)))
