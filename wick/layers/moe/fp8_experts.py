"""MoE experts in fp8 (e4m3) with float32 scales: half of bf16's bytes.

An FP8 checkpoint's experts come with scales over 128 x 128 blocks (`weight_scale_inv`, as Qwen3-*-FP8 and DeepSeek-V3
ship them) or one scale an expert's matrix (`weight_scale`); a float checkpoint's are quantized as they load with
`-q fp8`, one scale a row. On a GPU that converts fp8 in hardware (compute capability 8.9 or more) they are read as held
(W8A16): up to EXPERT_GEMV_MAX_PAIRS (token, expert) pairs (decode, and EXPERT_GEMV_PAIRS_PER_EXPERT an expert) by the
fp8 GEMV, each pair's expert chosen inside it, past them by the fused MoE kernel's tiles over the pairs sorted by
expert. On an older GPU they are converted to the model's dtype at load, and the CPU reference converts each expert a
token chose as it meets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import torch
from torch import nn

from wick.kernels.fp8_matmul import fp8_dequantize
from wick.layers.quantization.fp8 import FP8_MAX, Fp8Config, quantize_rows

if TYPE_CHECKING:
    from wick.kernels.pair_sum import PairRows
    from wick.layers.moe.fused_moe import FusedMoE

# (token, expert) pairs up to which the GEMVs run (each pair reads its expert's rows, k contiguous), and no more than
# EXPERT_GEMV_PAIRS_PER_EXPERT times the experts; past them the tiles (tl.dot over the pairs sorted by expert). On an
# H100 (benchmarks/kernels/bench_fused_moe.py --fp8): Qwen3-30B-A3B's experts (128), GEMVs 164 against tiles 220 us
# at 128 pairs, 1,165 against 464 at 1,024; Mixtral's shape (8), 491 against 614 at 16 pairs, 843 against 623 at 32.
EXPERT_GEMV_MAX_PAIRS = 128
EXPERT_GEMV_PAIRS_PER_EXPERT = 2
# Where each expert's per-tensor scale goes in a [experts, 2 | 1, 1] scale: gate and up of w13, down of w2.
_SHARD_INDEX = {"gate": 0, "up": 1, "down": 0}


@dataclass
class Fp8Experts:
    """`data` [experts, rows, columns] e4m3, `scale` [experts, ceil(rows / block[0]), ceil(columns / block[1])]
    float32, each over a block[0] x block[1] tile of an expert's matrix; read as `dtype`."""

    data: torch.Tensor
    scale: torch.Tensor
    block: tuple[int, int]
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.data.shape)

    @property
    def scales(self) -> tuple[torch.Tensor, tuple[int, int]]:
        """(scale, block), as the fused MoE kernel takes them."""
        return self.scale, self.block

    def __getitem__(self, expert: int) -> torch.Tensor:
        """One expert's matrix [rows, columns] in `dtype`."""
        return fp8_dequantize(self.data[expert], self.scale[expert], self.block).to(self.dtype)

    def dequantize_all(self) -> torch.Tensor:
        """Every expert's matrix: [experts, rows, columns] in `dtype`."""
        return torch.stack([self[expert] for expert in range(self.data.shape[0])])


def _param(shape: tuple[int, ...], dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)


class Fp8ExpertWeights:
    """Creates an MoE layer's fp8 expert parameters (w13 [E, 2I, H] and w2 [E, H, I] in e4m3, and their scales),
    stores each checkpoint shard the layer's loader hands it, and gives the layer its two Fp8Experts."""

    def __init__(self, config: Fp8Config, layer: FusedMoE) -> None:
        self.config = config
        e, i, h = layer.spec.num_experts, layer.intermediate_size, layer.hidden_size
        layer.w13_weight = _param((e, 2 * i, h), torch.float8_e4m3fn)
        layer.w2_weight = _param((e, h, i), torch.float8_e4m3fn)
        if config.in_situ:
            scale13, scale2 = _param((e, 2 * i, 1), torch.float32), _param((e, h, 1), torch.float32)
            blocks = (1, h), (1, i)
            for scale in (scale13, scale2):
                scale.optional = True  # derived from the float weights as they load
        elif config.block is not None:
            blocks = (config.block, config.block)
            bn, bk = config.block
            if i % bn or (layer.tp_size > 1 and i % bk):
                raise ValueError(f"FP8 experts in {bn}x{bk} blocks need the expert intermediate size on each rank "
                                 f"({i}) to be a multiple of the block")
            if bk & -bk < 16:  # the tiles step whole scale tiles of at least 16 columns (tl.dot's least K)
                raise ValueError(f"FP8 experts in {bn}x{bk} blocks are not supported: the block's width must be a "
                                 "multiple of 16")
            scale13 = _param((e, 2 * i // bn, -(-h // bk)), torch.float32)
            scale2 = _param((e, -(-h // bn), -(-i // bk)), torch.float32)
            for scale in (scale13, scale2):
                scale.weight_loader = partial(layer.copy_rank_shards, block=config.block)
        else:
            scale13, scale2 = _param((e, 2, 1), torch.float32), _param((e, 1, 1), torch.float32)
            blocks = (i, h), (h, i)  # one scale for each of gate, up and down
            for scale in (scale13, scale2):
                scale.weight_loader = _load_shard_scale
            if config.static_activations:  # read for completeness; activations stay in the model's dtype
                layer.w13_input_scale = _param((e, 2, 1), torch.float32)
                layer.w2_input_scale = _param((e, 1, 1), torch.float32)
                layer.w13_input_scale.weight_loader = layer.w2_input_scale.weight_loader = _load_shard_scale
        suffix = "weight_scale_inv" if config.block is not None and not config.in_situ else "weight_scale"
        setattr(layer, f"w13_{suffix}", scale13)
        setattr(layer, f"w2_{suffix}", scale2)
        self.scale_names = [f"w13_{suffix}", f"w2_{suffix}"] + (
            ["w13_input_scale", "w2_input_scale"] if hasattr(layer, "w13_input_scale") else [])
        self.experts = {"w13": Fp8Experts(layer.w13_weight.data, scale13.data, blocks[0], layer.params_dtype),
                        "w2": Fp8Experts(layer.w2_weight.data, scale2.data, blocks[1], layer.params_dtype)}

    def quantize(self, name: str, expert: int, offset: int, rows: int, matrix: torch.Tensor) -> None:
        """Rows offset .. offset + rows of one expert's w13 or w2 (`name`) from a float checkpoint, quantized a row
        at a time."""
        experts = self.experts[name]
        target = experts.data[expert].narrow(0, offset, rows)
        weight, scale = quantize_rows(matrix.to(target.device))
        target.copy_(weight)
        experts.scale[expert].narrow(0, offset, rows).copy_(scale)

    def initialize_dummy(self, generator: torch.Generator, low: float, high: float) -> None:
        """Random experts: floats uniform in [low, high] in e4m3 with one scale for all."""
        scale = max(abs(low), abs(high)) / FP8_MAX
        for experts in self.experts.values():
            for expert in range(experts.data.shape[0]):
                floats = torch.empty(experts.shape[1:], device=experts.data.device).uniform_(low, high,
                                                                                         generator=generator)
                experts.data[expert].copy_((floats / scale).to(torch.float8_e4m3fn))
            experts.scale.fill_(scale)


def _load_shard_scale(param: nn.Parameter, loaded: torch.Tensor, shard_id: tuple[str, int | None]) -> None:
    """One expert's per-tensor scale of its gate, up or down matrix."""
    kind, expert = shard_id
    if expert is None or kind not in _SHARD_INDEX:
        raise ValueError(f"a per-tensor fp8 scale of experts stacked as {kind!r} is not supported")
    param.data[expert, _SHARD_INDEX[kind]] = loaded.reshape(()).float()


def fused_experts_fp8(x: torch.Tensor, w13: Fp8Experts, w2: Fp8Experts, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, path: str | None = None, unsummed: bool = False
                      ) -> torch.Tensor | PairRows:
    """fused_experts (wick/kernels/fused_moe.py) over fp8 experts, on a GPU. path (for benchmarks; None picks the
    first that runs): "gemv", the fp8 GEMVs, up to EXPERT_GEMV_MAX_PAIRS pairs and EXPERT_GEMV_PAIRS_PER_EXPERT an
    expert; "tiles", the fused MoE kernel.
    unsummed: the GEMVs' pairs are left unsummed (pair_sum.PairRows), for the norm after the layer to sum."""
    from wick.kernels.fp8_matmul import fp8_expert_gemv, runs_expert_gemv
    from wick.kernels.fused_moe import fused_experts, pair_bound
    from wick.kernels.pair_sum import summed_unless

    tokens, top_k = topk_ids.shape
    gemv = runs_expert_gemv(w13.block, w13.shape[2]) and runs_expert_gemv(w2.block, w2.shape[2])
    if path is None:
        bound = pair_bound(EXPERT_GEMV_MAX_PAIRS, EXPERT_GEMV_PAIRS_PER_EXPERT, w13.data.shape[0])
        path = "gemv" if gemv and tokens * top_k <= bound else "tiles"
    if path == "gemv" and not gemv:
        raise ValueError(f"fp8 experts with scale tiles {w13.block} and {w2.block} have no gemv path")
    if path == "tiles":
        return fused_experts(x, w13.data, w2.data, topk_weights, topk_ids, w13_scales=w13.scales,
                             w2_scales=w2.scales)
    ids = topk_ids.flatten()
    mid = fp8_expert_gemv(x, w13.data, w13.scale, w13.block, ids, top_k, activation="silu")
    down = fp8_expert_gemv(mid, w2.data, w2.scale, w2.block, ids, 1)
    return summed_unless(down, topk_weights, unsummed)
