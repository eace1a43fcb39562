"""The contract between a linear layer and its weights' format (vLLM's shape).

A `QuantizationConfig` says how a checkpoint's weights are stored and hands each linear layer a
`LinearMethod`. The method creates the layer's parameters, tagging each with where its output and
input dimensions lie and how many logical elements one stored element covers along them, so the
layer's weight loader can take this rank's shard of any of them; after loading it may repack them,
and at run time it computes y = x W^T (+ b).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from gguf import GGMLQuantizationType

# Rows of x from which a GPTQ/AWQ layer on a GPU dequantizes W whole (one kernel) and multiplies in x's dtype
# (cuBLAS), as it does on the CPU. Llama-3.1-8B's four layers on an H100 (docs/benchmarks.md, session 16): the tile
# kernel 0.349 against 0.411 ms at 64 rows, 0.417 against 0.428 at 128, 0.602 against 0.453 at 256, 20.9 against
# 5.3 at 8,192. FP8 has its own bound (fp8.TILE_MAX_ROWS).
DEQUANTIZE_MIN_ROWS = 128


class QuantizationConfig(ABC):
    """How the weights of one model are stored. `name` is what the load log and errors show."""

    name: str = ""
    # Whether its layers' batch-1 GEMVs quantize x to int8 first (int8_activations.quantize_q8), which takes them out
    # of programmatic dependent launch's early start (kernels/pdl.py).
    int8_activations: bool = False

    @abstractmethod
    def get_linear_method(self) -> LinearMethod:
        """The method for one linear layer (a fresh object or a shared stateless one)."""

    def packs_gguf(self) -> bool:
        """Whether GGUF tensors reach the layers in their block format (else as float)."""
        return False

    def describe(self) -> str:
        """The weights' format for the load log line."""
        return self.name

    def expert_type(self) -> GGMLQuantizationType | None:
        """The GGUF type a float checkpoint's MoE experts are quantized into as they load (None: they load as
        they are)."""
        return None


class LinearMethod(ABC):
    """Creates, loads (shard by shard, through the layer's weight loader) and applies a layer's weights."""

    # Whether `apply` and `apply_gated` take x as a layers.pending_norm.PendingNorm, whose norm a kernel of theirs
    # may apply (else x reaches them normed).
    reads_pending_norm = False
    # Whether `apply` takes x as a pending row of a row-parallel layer's input: a layers.pending_act.PendingAct (a gated
    # activation left for it; else x reaches it activated) or a layers.pending_combine.PendingCombine (a split
    # attention's output; else it reaches it combined).
    reads_pending_rows = False

    @abstractmethod
    def create_weights(self, layer: nn.Module, input_size: int, output_sizes: list[int],
                       params_dtype: torch.dtype) -> None:
        """Register the layer's weight parameters for this rank: `input_size` input features and the
        output features of each merged shard (`output_sizes`, already divided by the TP size)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Repack the loaded weights for `apply` (called once every shard is loaded); nothing by default."""
        return None

    def held_tensors(self, layer: nn.Module) -> list[torch.Tensor]:
        """Weight tensors the method keeps outside the layer's parameters (for the size in the load log)."""
        return []

    def initialize_dummy(self, layer: nn.Module, generator: torch.Generator, low: float, high: float) -> None:
        """Give the layer random weights in its format (floats uniform in [low, high] before any
        quantization); float parameters are already filled by the dummy loader."""
        return None

    @abstractmethod
    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """y = x W^T (+ bias) for x of shape [..., input_size]."""

    def apply_gated(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None,
                    activation: str) -> torch.Tensor | None:
        """act(gate) * up of a layer whose output rows are gate's then up's, in one kernel, where the method has
        one for x (`activation` a wick.kernels.activation.ACTIVATIONS name); None where it has not."""
        return None


def set_weight_attrs(param: nn.Parameter, **attrs: Any) -> nn.Parameter:
    """Tag a parameter for the layer's weight loader.

    output_dim / input_dim: the parameter's dimension along the layer's output / input features
    (None: not split along that axis). output_pack / input_pack: logical features per stored element
    along that dimension (8 for int32 words of 4-bit values, the group size for group scales).
    per_shard: a [num_shards] parameter holding one value per merged shard (per-tensor scales).
    weight_loader: a loader of the method's own, used instead of the layer's.
    optional: a checkpoint may leave the parameter out (the method then derives it).
    """
    for key, value in attrs.items():
        setattr(param, key, value)
    return param


_current: list[QuantizationConfig | None] = [None]


@contextlib.contextmanager
def quantization_scope(config: QuantizationConfig | None) -> Iterator[None]:
    """Linear layers built inside take their method from `config` (None: unquantized)."""
    previous = _current[0]
    _current[0] = config
    try:
        yield
    finally:
        _current[0] = previous


def current_quantization() -> QuantizationConfig | None:
    return _current[0]
