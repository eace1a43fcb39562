"""Tensor-parallel linear layers whose parameters load their own shard of a full checkpoint tensor.

Column-parallel layers split the output dimension across ranks, row-parallel layers split the
input dimension and all-reduce the partial sums. Merged layers (gate/up, q/k/v) hold several
checkpoint tensors side by side; their weight loader places each shard at its offset.

The parameters themselves belong to the layer's quantization method (wick/layers/quantization/),
which tags each with its output and input dimensions; the loader here takes this rank's part of a
checkpoint tensor along those dimensions, whatever the format.
"""

from __future__ import annotations

import torch
from torch import nn

from wick.distributed.communication import PartialSum, tp_all_reduce, tp_rank, tp_world_size
from wick.layers.pending_act import PendingAct
from wick.layers.pending_combine import PendingCombine
from wick.layers.pending_norm import PendingNorm, resolved
from wick.layers.quantization.base import LinearMethod, current_quantization
from wick.layers.quantization.gguf import as_dense
from wick.layers.quantization.unquantized import UnquantizedLinearMethod


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by the tensor-parallel size {denominator}")
    return numerator // denominator


def _packed(size: int, pack: int, what: str) -> int:
    if size % pack:
        raise ValueError(f"{what} of {size} features is not a whole number of packed units of {pack}")
    return size // pack


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: None = None) -> None:
    """For replicated parameters: the checkpoint tensor is the whole parameter (a packed GGUF one dequantized)."""
    loaded_weight = as_dense(loaded_weight, param.dtype)
    if param.shape != loaded_weight.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, checkpoint {tuple(loaded_weight.shape)}")
    param.data.copy_(loaded_weight)


class LinearBase(nn.Module):
    """y = x W^T (+ b) with W of shape [output_size, input_size] as held on this rank.

    Subclasses say where each shard lies: `output_shard` (rows of this rank's output and where they
    start in the checkpoint tensor) and `input_shard` (the checkpoint's columns this rank holds).
    """

    input_is_sharded = False

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool,
                 method: LinearMethod | None = None) -> None:
        super().__init__()
        self.tp_rank = tp_rank()
        self.tp_size = tp_world_size()
        self.input_size = input_size
        self.output_sizes = output_sizes
        self.output_size = sum(output_sizes)
        if method is None:
            config = current_quantization()
            method = config.get_linear_method() if config is not None else UnquantizedLinearMethod()
        self.quant_method = method
        method.create_weights(self, input_size, output_sizes, torch.get_default_dtype())
        if bias:
            self.bias = nn.Parameter(torch.empty(self.output_size), requires_grad=False)
            self.bias.output_dim = 0
        else:
            self.register_parameter("bias", None)
        for param in self.parameters(recurse=False):
            if not hasattr(param, "weight_loader"):
                param.weight_loader = self.weight_loader

    def output_shard(self, shard_id: int | str | None) -> tuple[int, int, int]:
        """(offset in this rank's output, size, start in the checkpoint tensor) of a shard's rows."""
        return 0, self.output_size, 0

    def input_shard(self) -> tuple[int, int]:
        """(start, size) of the checkpoint tensor's input features that this rank holds."""
        return 0, self.input_size

    def shard_index(self, shard_id: int | str | None) -> int:
        return 0

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor,
                      shard_id: int | str | None = None) -> None:
        target = param.data
        if getattr(param, "per_shard", False):
            target[self.shard_index(shard_id)].copy_(loaded_weight.reshape(()))
            return
        output_dim = getattr(param, "output_dim", None)
        offset, size, start = self.output_shard(shard_id)
        # A parameter covering the whole dimension on one rank is copied whole (block scales may round its
        # size up); rank 0 of a column-parallel layer has offset and start 0 too, but only its share of rows.
        if output_dim is not None and (self.tp_size > 1 or (offset, size, start) != (0, self.output_size, 0)):
            pack = getattr(param, "output_pack", 1)
            what = "an output shard"
            target = target.narrow(output_dim, _packed(offset, pack, what), _packed(size, pack, what))
            loaded_weight = loaded_weight.narrow(output_dim, _packed(start, pack, what), _packed(size, pack, what))
        input_dim = getattr(param, "input_dim", None)
        if input_dim is not None and self.input_is_sharded:
            start, size = self.input_shard()
            pack = getattr(param, "input_pack", 1)
            loaded_weight = loaded_weight.narrow(input_dim, _packed(start, pack, "an input shard"),
                                                 _packed(size, pack, "an input shard"))
        if target.shape != loaded_weight.shape:
            raise ValueError(f"shape mismatch: parameter {tuple(target.shape)}, "
                             f"checkpoint {tuple(loaded_weight.shape)}")
        target.copy_(loaded_weight)

    def forward(self, x: torch.Tensor | PendingNorm) -> torch.Tensor:
        return self.quant_method.apply(self, self._input(x), self.bias)

    def _input(self, x: torch.Tensor | PendingNorm) -> torch.Tensor | PendingNorm:
        """x as the method takes it: a pending norm where the method may apply it itself, else a tensor."""
        return x if self.quant_method.reads_pending_norm else resolved(x)


class ColumnParallelLinear(LinearBase):
    """Output features split across ranks; each rank returns its slice (no communication)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(input_size, [divide(output_size, tp_world_size())], bias)

    def output_shard(self, shard_id: int | str | None) -> tuple[int, int, int]:
        return 0, self.output_size, self.tp_rank * self.output_size


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel projections of the same input in one matmul; shard_id is the index."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        tp_size = tp_world_size()
        LinearBase.__init__(self, input_size, [divide(size, tp_size) for size in output_sizes], bias)

    def output_shard(self, shard_id: int | str | None) -> tuple[int, int, int]:
        if not isinstance(shard_id, int) or not 0 <= shard_id < len(self.output_sizes):
            raise ValueError(f"MergedColumnParallelLinear shard id must be 0..{len(self.output_sizes) - 1}, "
                             f"not {shard_id!r}")
        size = self.output_sizes[shard_id]
        return sum(self.output_sizes[:shard_id]), size, self.tp_rank * size

    def shard_index(self, shard_id: int | str | None) -> int:
        return int(shard_id)  # type: ignore[arg-type]

    def gated(self, x: torch.Tensor | PendingNorm, act_fn: nn.Module, pending: bool = False
              ) -> torch.Tensor | PendingAct:
        """act_fn (wick.layers.activation's) over this layer's two outputs, gate and up: in one kernel where the
        weights' method has one for x, else the layer then act_fn, which with `pending` (its reader takes
        PendingAct) is left to the reader for one row on CUDA."""
        out = self.quant_method.apply_gated(self, self._input(x), self.bias, act_fn.kernel_name)
        if out is not None:
            return out
        out = self.forward(x)
        if pending and out.is_cuda and out.dim() == 2 and out.shape[0] == 1 and out.shape[1] % 64 == 0:
            return PendingAct(out, act_fn)
        return act_fn(out)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections side by side, split by heads; shard ids "q", "k", "v".

    With fewer kv heads than ranks, each kv head is replicated on tp_size // total_num_kv_heads ranks.
    """

    _SHARDS = ("q", "k", "v")

    def __init__(
        self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int, bias: bool = False
    ) -> None:
        tp_size = tp_world_size()
        self.head_size = head_size
        self.num_heads = divide(total_num_heads, tp_size)
        if tp_size >= total_num_kv_heads:
            self.num_kv_heads = 1
            self.kv_replicas = divide(tp_size, total_num_kv_heads)
        else:
            self.num_kv_heads = divide(total_num_kv_heads, tp_size)
            self.kv_replicas = 1
        q_size, kv_size = self.num_heads * head_size, self.num_kv_heads * head_size
        LinearBase.__init__(self, hidden_size, [q_size, kv_size, kv_size], bias)

    def output_shard(self, shard_id: int | str | None) -> tuple[int, int, int]:
        if shard_id not in self._SHARDS:
            raise ValueError(f"QKVParallelLinear shard id must be 'q', 'k' or 'v', not {shard_id!r}")
        index = self._SHARDS.index(shard_id)
        size = self.output_sizes[index]
        rank = self.tp_rank if shard_id == "q" else self.tp_rank // self.kv_replicas
        return sum(self.output_sizes[:index]), size, rank * size

    def shard_index(self, shard_id: int | str | None) -> int:
        return self._SHARDS.index(shard_id)  # type: ignore[arg-type]


class RowParallelLinear(LinearBase):
    """Input features split across ranks; the partial products are all-reduced. Rank 0 adds the bias."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__(divide(input_size, tp_world_size()), [output_size], bias)

    @property
    def input_is_sharded(self) -> bool:  # type: ignore[override]
        return self.tp_size > 1

    def input_shard(self) -> tuple[int, int]:
        return self.tp_rank * self.input_size, self.input_size

    def forward(self, x: torch.Tensor | PendingAct | PendingCombine, reduce: bool = True) -> torch.Tensor | PartialSum:
        """x: a PendingAct or PendingCombine only where the method reads one (reads_pending_rows). Without `reduce`
        the all-reduce is left to the reader, the norm after the layer (PartialSum), over more than one rank."""
        out = self.quant_method.apply(self, x, self.bias if self.tp_rank == 0 else None)
        return tp_all_reduce(out) if reduce or self.tp_size == 1 else PartialSum(out)
