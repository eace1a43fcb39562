"""GGUF weights kept in their block format.

A linear layer holds each merged shard's packed rows ([rows, row bytes] of uint8, one GGUF type per
shard; llama.cpp's mixes put e.g. Q6_K v beside Q4_K q and k). On a GPU, consecutive shards of one
type are joined and run by Triton kernels (a fused dequantize-GEMV for a few rows of input, for Q4_K, Q5_K and Q6_K
a dequantize-in-tile matmul up to a few hundred, W dequantized for cuBLAS past them); elsewhere the torch
dequantizers of wick/loader/gguf_dequant.py turn a bounded slice of rows back into floats per forward. On
CPU the packed rows stay views of the file's memory map, so the weights cost the file's pages and nothing more.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType
from torch import nn

from wick.layers.pending_norm import PendingRow, resolved
from wick.layers.quantization.base import LinearMethod, QuantizationConfig
from wick.layers.quantization.gguf_cpu import Int4Weight, Int8Weight, Piece, cpu_kernel_weight, float_rows_product
from wick.loader.gguf_dequant import SUPPORTED_TYPES, dequantize

# Rows of weight dequantized at once by the torch path: a bound on its temporary, not on speed.
_DEQUANT_CHUNK_BYTES = 64 << 20


@dataclass
class GGUFWeight:
    """A 2-D GGUF tensor as stored: `data` is [rows, row bytes] of uint8; `shape` is (rows, columns)."""

    data: torch.Tensor
    qtype: GGMLQuantizationType
    shape: tuple[int, int]
    # The same weight repacked for a CPU kernel (gguf_cpu.py), which then runs it instead of `data`.
    cpu_kernel: Int4Weight | Int8Weight | None = None

    @property
    def block_size(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][0]

    def rows(self, start: int, size: int) -> GGUFWeight:
        return GGUFWeight(self.data.narrow(0, start, size), self.qtype, (size, self.shape[1]))

    def columns(self, start: int, size: int) -> GGUFWeight:
        if start == 0 and size == self.shape[1]:
            return self
        block, type_size = GGML_QUANT_SIZES[self.qtype]
        if start % block or size % block:
            raise ValueError(f"a {self.qtype.name} tensor splits only at multiples of {block} columns, "
                             f"not at {start} + {size}: choose another tensor-parallel size")
        return GGUFWeight(self.data.narrow(1, start // block * type_size, size // block * type_size),
                          self.qtype, (self.shape[0], size))

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize(self.data, self.qtype, self.shape).to(dtype)

    def with_cpu_kernel(self, logits: bool = False) -> GGUFWeight:
        """This weight with its CPU kernel form, where it is on the CPU and its type has one (logits: an LM head's,
        see cpu_kernel_weight)."""
        return replace(self, cpu_kernel=cpu_kernel_weight([self.piece()], logits))

    def piece(self) -> Piece:
        return self.data, self.qtype, self.shape

    def held_tensors(self) -> list[torch.Tensor]:
        return self.cpu_kernel.tensors() if self.cpu_kernel is not None else [self.data]


def as_dense(weight: torch.Tensor | GGUFWeight, dtype: torch.dtype) -> torch.Tensor:
    """A checkpoint tensor for a layer that holds plain floats (a router, a replicated projection)."""
    return weight.dequantize(dtype) if isinstance(weight, GGUFWeight) else weight


_FLOAT_TYPES = {GGMLQuantizationType.F32: torch.float32, GGMLQuantizationType.F16: torch.float16,
                GGMLQuantizationType.BF16: torch.bfloat16}


def gguf_linear(x: torch.Tensor, weight: GGUFWeight) -> torch.Tensor:
    """x [..., columns] @ dequantized(weight)^T -> [..., rows], in x's dtype."""
    if weight.cpu_kernel is not None:
        return weight.cpu_kernel(x)
    if weight.qtype in _FLOAT_TYPES:
        return x @ weight.data.view(_FLOAT_TYPES[weight.qtype]).to(x.dtype).t()
    if x.is_cuda and weight.qtype in _triton_types():
        from wick.kernels.gguf_matmul import gguf_matmul

        return gguf_matmul(x, weight.data, weight.qtype, weight.shape)
    return float_rows_product(x, weight.shape[0], _DEQUANT_CHUNK_BYTES,
                              lambda start, size: weight.rows(start, size).dequantize(x.dtype))


def gguf_embedding(ids: torch.Tensor, weight: GGUFWeight, dtype: torch.dtype) -> torch.Tensor:
    """The rows `ids` of a packed embedding, dequantized: [*ids.shape, columns]."""
    rows = weight.data[ids.reshape(-1)]
    return dequantize(rows, weight.qtype, (rows.shape[0], weight.shape[1])).to(dtype).reshape(
        *ids.shape, weight.shape[1])


def _triton_types() -> frozenset[GGMLQuantizationType]:
    from wick.kernels.gguf_matmul import TRITON_TYPES

    return TRITON_TYPES


class GGUFConfig(QuantizationConfig):
    name = "gguf"
    int8_activations = True

    def __init__(self, file_type: int | None = None) -> None:
        self.file_type = file_type

    def get_linear_method(self) -> LinearMethod:
        return GGUFLinearMethod()

    def packs_gguf(self) -> bool:
        return True

    def describe(self) -> str:
        if self.file_type is None:
            return "GGUF"
        try:
            return LlamaFileType(self.file_type).name.removeprefix("MOSTLY_").removeprefix("ALL_")
        except ValueError:
            return f"GGUF file type {self.file_type}"


class GGUFLinearMethod(LinearMethod):
    """The layer's `weight` parameter is a placeholder for the loader; the packed shards live in
    `layer.gguf_shards` (while loading) and `layer.gguf_parts` (after)."""

    reads_pending_norm = True
    reads_pending_rows = True

    def create_weights(self, layer: nn.Module, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        weight = nn.Parameter(torch.empty(0, dtype=torch.uint8), requires_grad=False)
        weight.weight_loader = partial(self._load, layer)
        layer.register_parameter("weight", weight)
        layer.gguf_shards = {}
        layer.gguf_parts = []
        layer.cpu_kernel = None

    @staticmethod
    def _load(layer: nn.Module, param: nn.Parameter, loaded: GGUFWeight | torch.Tensor,
              shard_id: int | str | None = None) -> None:
        if not isinstance(loaded, GGUFWeight):
            raise TypeError(f"a GGUF layer loads packed GGUF tensors, got {type(loaded).__name__}")
        if loaded.qtype not in SUPPORTED_TYPES:
            raise NotImplementedError(f"GGUF tensor type {loaded.qtype.name} is not supported")
        offset, size, start = layer.output_shard(shard_id)
        in_start, in_size = layer.input_shard()
        if loaded.shape[0] < start + size:
            raise ValueError(f"GGUF tensor of {loaded.shape[0]} rows is smaller than the layer's shard")
        part = loaded.rows(start, size).columns(in_start, in_size)
        if part.shape != (size, layer.input_size):
            raise ValueError(f"shape mismatch: layer shard {(size, layer.input_size)}, GGUF tensor {part.shape}")
        data = part.data.to(param.device)
        layer.gguf_shards[offset] = GGUFWeight(data, part.qtype, part.shape)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        shards = [layer.gguf_shards[offset] for offset in sorted(layer.gguf_shards)]
        if sum(s.shape[0] for s in shards) != layer.output_size:
            raise ValueError("a GGUF layer is missing some of its merged shards")
        parts: list[GGUFWeight] = []
        for shard in shards:
            last = parts[-1] if parts else None
            # Joining copies; on CPU the shards stay views of the file instead.
            if last is not None and last.qtype == shard.qtype and shard.data.device.type != "cpu":
                parts[-1] = GGUFWeight(torch.cat([last.data, shard.data]), shard.qtype,
                                       (last.shape[0] + shard.shape[0], shard.shape[1]))
            else:
                parts.append(shard)
        # On a CPU one kernel runs all the shards where it can (one call for q, k and v), else each its own.
        layer.cpu_kernel = cpu_kernel_weight([part.piece() for part in parts])
        layer.gguf_parts = parts if layer.cpu_kernel is not None else [part.with_cpu_kernel() for part in parts]
        layer.gguf_shards = {}

    def held_tensors(self, layer: nn.Module) -> list[torch.Tensor]:
        if layer.cpu_kernel is not None:
            return layer.cpu_kernel.tensors()
        return [tensor for part in layer.gguf_parts for tensor in part.held_tensors()]

    def apply(self, layer: nn.Module, x: torch.Tensor | PendingRow, bias: torch.Tensor | None
              ) -> torch.Tensor:
        if layer.cpu_kernel is not None:
            out = layer.cpu_kernel(resolved(x))
            return out + bias if bias is not None else out
        return apply_gguf_parts(layer.gguf_parts, x, bias)


def _runs_int8_gemv(part: GGUFWeight) -> bool:
    """Whether a row reaching `part` on the GPU takes its int8 GEMV."""
    if part.cpu_kernel is not None or part.qtype not in _triton_types():
        return False
    from wick.kernels.gguf_int8_gemv import runs_int8_gemv

    return runs_int8_gemv(part.qtype, part.data)


def apply_gguf_parts(parts: list[GGUFWeight], x: torch.Tensor | PendingRow, bias: torch.Tensor | None
                     ) -> torch.Tensor:
    """x @ [part_0; part_1; ...]^T (+ bias). A pending row (a norm's, an activation's, a split attention's) that only
    int8 GEMVs read reaches them rounded to int8 by the kernel that makes it, once for every part."""
    if isinstance(x, PendingRow) and all(_runs_int8_gemv(part) for part in parts):
        from wick.kernels.gguf_matmul import gguf_int8_rows_matmul

        rows = x.int8_rows()
        outputs = [gguf_int8_rows_matmul(rows, part.data, part.qtype, part.shape[0], x.dtype) for part in parts]
    else:
        x = resolved(x)
        outputs = [gguf_linear(x, part) for part in parts]
    out = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=-1)
    return out + bias if bias is not None else out
