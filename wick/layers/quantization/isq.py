"""In-situ quantization: full-precision checkpoints quantized into GGUF blocks as they load.

Each layer's float weight exists only while its shards arrive; once the last one is in, the layer is
quantized (on the weight's device: the GPU when there is one) and the float copy is freed, so the
peak is the quantized model plus one layer. The packed blocks then run exactly as a GGUF file's.
K-quant types need rows of a multiple of 256 values; narrower layers take llama.cpp's fallback type.
"""

from __future__ import annotations

import logging
from functools import partial

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from wick.layers.pending_norm import PendingRow
from wick.layers.quantization.base import LinearMethod, QuantizationConfig, set_weight_attrs
from wick.layers.quantization.gguf import GGUFWeight, apply_gguf_parts
from wick.layers.quantization.gguf_quantize import quantize

logger = logging.getLogger(__name__)

T = GGMLQuantizationType
# llama.cpp's choice for tensors whose rows are not whole 256-value super-blocks.
_FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}


class InSituGGUFConfig(QuantizationConfig):
    int8_activations = True

    def __init__(self, name: str) -> None:
        self.name = name
        self.qtype = GGMLQuantizationType[name.upper()]

    def get_linear_method(self) -> LinearMethod:
        return InSituGGUFMethod(self.qtype)

    def describe(self) -> str:
        return f"{self.qtype.name} (in-situ)"

    def expert_type(self) -> GGMLQuantizationType:
        return self.qtype


def _type_for(qtype: GGMLQuantizationType, columns: int) -> GGMLQuantizationType:
    if columns % GGML_QUANT_SIZES[qtype][0] == 0:
        return qtype
    fallback = _FALLBACK.get(qtype)
    if fallback is None or columns % GGML_QUANT_SIZES[fallback][0]:
        raise ValueError(f"a layer of {columns} input features cannot be quantized to {qtype.name}")
    return fallback


class InSituGGUFMethod(LinearMethod):
    reads_pending_norm = True
    reads_pending_rows = True

    def __init__(self, qtype: GGMLQuantizationType) -> None:
        self.qtype = qtype

    def create_weights(self, layer: nn.Module, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(0, dtype=params_dtype), requires_grad=False)
        set_weight_attrs(weight, output_dim=0, input_dim=1, weight_loader=partial(self._load, layer))
        layer.register_parameter("weight", weight)
        layer.isq_dtype = params_dtype
        layer.isq_pending = set(range(len(output_sizes)))
        layer.gguf_parts = []

    def _load(self, layer: nn.Module, param: nn.Parameter, loaded: torch.Tensor,
              shard_id: int | str | None = None) -> None:
        if not layer.isq_pending:
            raise ValueError("a quantized layer got a weight shard twice")
        if param.numel() == 0:
            param.data = torch.empty(layer.output_size, layer.input_size, dtype=layer.isq_dtype, device=param.device)
        layer.weight_loader(param, loaded, shard_id)
        layer.isq_pending.discard(layer.shard_index(shard_id))
        if not layer.isq_pending:
            self._quantize(layer)

    def _quantize(self, layer: nn.Module) -> None:
        qtype = _type_for(self.qtype, layer.input_size)
        if qtype != self.qtype:
            logger.debug("%d-wide layer quantized to %s instead of %s", layer.input_size, qtype.name, self.qtype.name)
        packed = quantize(layer.weight.data, qtype)
        layer.gguf_parts = [GGUFWeight(packed, qtype, (layer.output_size, layer.input_size)).with_cpu_kernel()]
        layer.weight.data = torch.empty(0, dtype=layer.isq_dtype, device=packed.device)

    def initialize_dummy(self, layer: nn.Module, generator: torch.Generator, low: float, high: float) -> None:
        weight = layer.weight
        weight.data = torch.empty(layer.output_size, layer.input_size, dtype=layer.isq_dtype, device=weight.device)
        weight.data.uniform_(low, high, generator=generator)
        layer.isq_pending = set()
        self._quantize(layer)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if layer.isq_pending:
            raise ValueError("a layer to quantize in situ is missing some of its merged shards")

    def held_tensors(self, layer: nn.Module) -> list[torch.Tensor]:
        return [tensor for part in layer.gguf_parts for tensor in part.held_tensors()]

    def apply(self, layer: nn.Module, x: torch.Tensor | PendingRow, bias: torch.Tensor | None
              ) -> torch.Tensor:
        return apply_gguf_parts(layer.gguf_parts, x, bias)
