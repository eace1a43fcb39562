"""The experts of an MoE layer as two stacked weights, and the computation over them.

w13 [E, 2 * I, H] holds each expert's gate and up projections side by side, w2 [E, H, I] its down
projection. Under tensor parallelism each rank holds every expert's slice of the intermediate
dimension I (gate/up rows, down columns) and the partial outputs are all-reduced, as a row-parallel
linear's are. On CUDA the fused Triton kernel runs; elsewhere the torch reference below.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from torch import nn

from wick.distributed.communication import tp_all_reduce, tp_rank, tp_world_size
from wick.layers.linear import divide
from wick.layers.moe.fp8_experts import Fp8Experts, Fp8ExpertWeights, fused_experts_fp8
from wick.layers.moe.gguf_experts import PackedExperts, fused_experts_gguf, packs_experts
from wick.layers.moe.routing import select_experts
from wick.layers.moe.wna16_experts import Wna16Experts, Wna16ExpertWeights, fused_experts_wna16
from wick.layers.pending_norm import PendingNorm
from wick.layers.quantization.awq import AWQConfig
from wick.layers.quantization.base import QuantizationConfig, current_quantization
from wick.layers.quantization.fp8 import Fp8Config
from wick.layers.quantization.gguf import GGUFWeight, as_dense
from wick.layers.quantization.gguf_quantize import quantize
from wick.layers.quantization.gptq import GPTQConfig
from wick.layers.quantization.unquantized import dense_linear

if TYPE_CHECKING:
    from wick.kernels.pair_sum import PairRows
    from wick.models.config import MoeSpec

logger = logging.getLogger(__name__)


@cache
def _warn_once(message: str) -> None:
    logger.warning(message)


Experts = torch.Tensor | PackedExperts | Fp8Experts | Wna16Experts


def fused_experts_ref(
    x: torch.Tensor, w13: Experts, w2: Experts, topk_weights: torch.Tensor,
    topk_ids: torch.Tensor
) -> torch.Tensor:
    """sum_k weight_k * down_e(silu(gate_e(x)) * up_e(x)) over each token's chosen experts e = ids_k."""
    out = torch.zeros_like(x)
    flat_ids = topk_ids.flatten()
    order = flat_ids.argsort(stable=True)
    counts = torch.bincount(flat_ids, minlength=w13.shape[0]).tolist()
    top_k = topk_ids.shape[1]
    start = 0
    for expert, count in enumerate(counts):
        if count == 0:
            continue
        rows = order[start:start + count]
        start += count
        tokens = rows // top_k
        gate, up = F.linear(x[tokens], w13[expert]).chunk(2, dim=-1)
        y = F.linear(F.silu(gate) * up, w2[expert])
        out.index_add_(0, tokens, (y * topk_weights.flatten()[rows, None]).to(x.dtype))
    return out


# (token, expert) pairs up to which float experts run as GEMVs on a GPU (wick/kernels/expert_gemv.py), and no more than
# GEMV_PAIRS_PER_EXPERT times the experts (each pair reads its expert's rows); past them the fused MoE kernel's tiles.
GEMV_MAX_PAIRS = 16
GEMV_PAIRS_PER_EXPERT = 2


def fused_experts_float(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, path: str | None = None) -> torch.Tensor:
    """fused_experts_ref over float experts on a GPU. path (for benchmarks; None picks): "gemv", the expert GEMVs, up to
    GEMV_MAX_PAIRS pairs and GEMV_PAIRS_PER_EXPERT an expert; "tiles", the fused MoE kernel."""
    # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
    from wick.kernels.expert_gemv import gemv_experts
    from wick.kernels.fused_moe import fused_experts, pair_bound

    if path is None:
        bound = pair_bound(GEMV_MAX_PAIRS, GEMV_PAIRS_PER_EXPERT, w13.shape[0])
        path = "gemv" if topk_ids.numel() <= bound else "tiles"
    if path == "gemv":
        return gemv_experts(x, w13, w2, topk_weights, topk_ids)
    return fused_experts(x, w13, w2, topk_weights, topk_ids)


class RouterLinear(nn.Module):
    """The replicated router: hidden [T, H] -> logits [T, E]; DeepSeek V3 adds a correction bias."""

    def __init__(self, hidden_size: int, num_experts: int, correction_bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden_size), requires_grad=False)
        self.weight.weight_loader = _replicated_loader
        if correction_bias:
            bias = nn.Parameter(torch.zeros(num_experts, dtype=torch.float32), requires_grad=False)
            bias.weight_loader = _replicated_loader
            self.e_score_correction_bias = bias
        else:
            self.e_score_correction_bias = None

    def forward(self, x: torch.Tensor | PendingNorm) -> torch.Tensor:
        return dense_linear(x, self.weight)


def _replicated_loader(param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: None = None) -> None:
    loaded_weight = as_dense(loaded_weight, param.dtype)  # a router matrix of a GGUF file comes packed
    if param.shape != loaded_weight.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, checkpoint {tuple(loaded_weight.shape)}")
    param.data.copy_(loaded_weight)


class FusedMoE(nn.Module):
    """Routes each token to its top-k experts and sums their weighted outputs."""

    def __init__(self, spec: MoeSpec, hidden_size: int) -> None:
        super().__init__()
        self.spec = spec
        self.tp_rank = tp_rank()
        self.tp_size = tp_world_size()
        self.intermediate_size = divide(spec.intermediate_size, self.tp_size)
        e, i = spec.num_experts, self.intermediate_size
        self.hidden_size = hidden_size
        self.params_dtype = torch.get_default_dtype()
        # A GGUF checkpoint's experts arrive packed: w13's and w2's buffers are made at their first expert's load,
        # packed (in `packed`) where their type has kernels, else as floats. In-situ quantization packs a float
        # checkpoint's experts as each shard arrives. FP8 experts stay fp8 (`fp8`), a float checkpoint's quantized
        # as they load. GPTQ and AWQ experts stay in their 4 or 8 bits (`wna16`).
        config = current_quantization()
        self.gguf = config is not None and config.packs_gguf()
        self.isq_type = self._in_situ_type(config)
        self.packed: dict[str, PackedExperts] = {}
        self.fp8: Fp8ExpertWeights | None = None
        self.wna16: Wna16ExpertWeights | None = None
        if isinstance(config, (GPTQConfig, AWQConfig)):
            self.wna16 = Wna16ExpertWeights(config, self)
            return
        if isinstance(config, Fp8Config):
            self.fp8 = Fp8ExpertWeights(config, self)
        elif self.gguf:
            self.w13_weight = nn.Parameter(torch.empty(0), requires_grad=False)
            self.w2_weight = nn.Parameter(torch.empty(0), requires_grad=False)
        elif self.isq_type is not None:
            block, type_size = GGML_QUANT_SIZES[self.isq_type]
            self.w13_weight = nn.Parameter(torch.empty(e, 2 * i, hidden_size // block * type_size, dtype=torch.uint8),
                                           requires_grad=False)
            self.w2_weight = nn.Parameter(torch.empty(e, hidden_size, i // block * type_size, dtype=torch.uint8),
                                          requires_grad=False)
            self.packed = {"w13": PackedExperts(self.w13_weight.data, self.isq_type, hidden_size, self.params_dtype),
                           "w2": PackedExperts(self.w2_weight.data, self.isq_type, i, self.params_dtype)}
        else:
            self.w13_weight = nn.Parameter(torch.empty(e, 2 * i, hidden_size), requires_grad=False)
            self.w2_weight = nn.Parameter(torch.empty(e, hidden_size, i), requires_grad=False)
        self.w13_weight.weight_loader = self.weight_loader
        self.w2_weight.weight_loader = self.weight_loader

    def _in_situ_type(self, config: QuantizationConfig | None) -> GGMLQuantizationType | None:
        """The GGUF type this layer's float experts are quantized into as they load, where they can run in it."""
        qtype = None if config is None else config.expert_type()
        if qtype is None:
            return None
        dtype = str(self.params_dtype).removeprefix("torch.")
        if not (packs_experts(qtype, self.hidden_size) and packs_experts(qtype, self.intermediate_size)):
            _warn_once(f"MoE experts stay in {dtype}: packed experts need rows of whole 256-value groups, and "
                       f"their rows are {self.hidden_size} and {self.intermediate_size} (on this rank) wide")
            return None
        return qtype

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor | GGUFWeight,
                      shard_id: tuple[str, int | None]) -> None:
        """shard_id (kind, expert): kind "gate", "up" or "down" of one expert's [out, in] matrix, or
        "gate_up" / "down" of all experts at once ([E, 2 * I, H] / [E, H, I], expert None)."""
        kind, expert = shard_id
        if isinstance(loaded, GGUFWeight):
            self._load_packed(param, loaded, kind, expert)
            return
        name = "w2" if kind == "down" else "w13"
        fp8_in_situ = self.fp8 is not None and self.fp8.config.in_situ
        if self.fp8 is not None and not fp8_in_situ and loaded.dtype != torch.float8_e4m3fn:
            raise ValueError(f"an FP8 checkpoint's expert weight ({kind}) is {loaded.dtype}, not float8_e4m3fn")
        if self.isq_type is None and not fp8_in_situ:
            self.copy_rank_shards(param, loaded, shard_id)
            return
        for offset, rows, source in self._rank_shards(loaded, kind):
            for e, matrix in enumerate(source) if expert is None else ((expert, source),):
                if fp8_in_situ:
                    self.fp8.quantize(name, e, offset, rows, matrix)
                else:
                    packed = self.packed[name]
                    packed.data[e].narrow(0, offset, rows).copy_(quantize(matrix.to(packed.data.device), packed.qtype))

    def copy_rank_shards(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: tuple[str, int | None],
                         block: tuple[int, int] = (1, 1)) -> None:
        """This rank's rows of `loaded` (shard_id as weight_loader's) copied into `param` as they are; with `block`,
        the scales of fp8 experts over block[0] x block[1] tiles."""
        kind, expert = shard_id
        target = param.data if expert is None else param.data[expert]
        for offset, rows, source in self._rank_shards(loaded, kind, block):
            target.narrow(-2, offset, rows).copy_(source)

    def _rank_shards(self, loaded: torch.Tensor, kind: str, block: tuple[int, int] = (1, 1)
                     ) -> list[tuple[int, int, torch.Tensor]]:
        """(first row, rows, this rank's part of `loaded`) for each block of rows of w13 or w2 (of one expert or
        of all) that a checkpoint tensor of `kind` fills; with `block`, of their scales over block[0] x block[1]
        tiles (the intermediate size on this rank and its start are whole tiles)."""
        bn, bk = block
        i, start = self.intermediate_size, self.tp_rank * self.intermediate_size
        if kind == "down":
            return [(0, loaded.shape[-2], loaded.narrow(-1, start // bk, -(-i // bk)))]
        if kind == "gate_up":
            full = loaded.shape[-2] // 2
            return [(0, i // bn, loaded.narrow(-2, start // bn, i // bn)),
                    (i // bn, i // bn, loaded.narrow(-2, full + start // bn, i // bn))]
        if kind in ("gate", "up"):
            return [(0 if kind == "gate" else i // bn, i // bn, loaded.narrow(-2, start // bn, i // bn))]
        raise ValueError(f"unknown expert shard {kind!r}")

    def _load_packed(self, param: nn.Parameter, loaded: GGUFWeight, kind: str, expert: int | None) -> None:
        if not self.gguf or expert is None or kind not in ("gate", "up", "down"):
            raise ValueError(f"a packed GGUF expert tensor ({kind!r}) reached a layer that does not hold them")
        e, i, start = self.spec.num_experts, self.intermediate_size, self.tp_rank * self.intermediate_size
        name, rows, columns = ("w2", self.hidden_size, i) if kind == "down" else ("w13", 2 * i, self.hidden_size)
        if param.numel() == 0:  # this tensor's first expert
            # a rank's columns of a down projection (columns = i, from rank * i) stay packed in whole 256-value groups
            if packs_experts(loaded.qtype, columns):
                row_bytes = (loaded.columns(start, i) if kind == "down" else loaded).data.shape[1]
                param.data = torch.empty(e, rows, row_bytes, dtype=torch.uint8, device=param.device)
                self.packed[name] = PackedExperts(param.data, loaded.qtype, columns, self.params_dtype)
            else:
                param.data = torch.empty(e, rows, columns, dtype=self.params_dtype, device=param.device)
        packed = self.packed.get(name)
        if packed is None:
            self.weight_loader(param, loaded.dequantize(self.params_dtype), (kind, expert))
            return
        if loaded.qtype != packed.qtype:
            raise ValueError(f"experts of one layer in two GGUF types ({packed.qtype.name} and {loaded.qtype.name}) "
                             "are not supported")
        if kind == "down":
            packed.data[expert].copy_(loaded.columns(start, i).data)
        else:
            packed.data[expert].narrow(0, 0 if kind == "gate" else i, i).copy_(loaded.rows(start, i).data)

    def initialize_dummy(self, generator: torch.Generator, low: float, high: float) -> None:
        """Random packed, fp8 or GPTQ/AWQ experts for the dummy loader: floats uniform in [low, high], quantized."""
        if self.fp8 is not None:
            self.fp8.initialize_dummy(generator, low, high)
        if self.wna16 is not None:
            self.wna16.initialize_dummy(generator, high)
        for packed in self.packed.values():
            experts, rows, columns = packed.shape
            for expert in range(experts):
                floats = torch.empty(rows, columns, device=packed.data.device).uniform_(low, high, generator=generator)
                packed.data[expert].copy_(quantize(floats, packed.qtype))

    def process_weights_after_loading(self) -> None:
        """Where only one of w13 and w2 stayed packed, it is decoded too: the kernels take both packed or neither.
        FP8 experts on a GPU that cannot convert fp8 in its kernels are converted to the model's dtype. GPTQ and AWQ
        experts are brought to their kernels' layout."""
        if self.wna16 is not None:
            self.wna16.process_weights_after_loading()
        if self.fp8 is not None and self.w13_weight.is_cuda and torch.cuda.get_device_capability(
                self.w13_weight.device) < (8, 9):
            _warn_once("MoE experts converted from fp8 to the model's dtype: this GPU has no fp8 conversions")
            self.w13_weight.data = self.fp8.experts["w13"].dequantize_all()
            self.w2_weight.data = self.fp8.experts["w2"].dequantize_all()
            for name in self.fp8.scale_names:
                delattr(self, name)
            self.fp8 = None
        if len(self.packed) == 1:
            name, packed = self.packed.popitem()
            getattr(self, f"{name}_weight").data = packed.dequantize_all()

    def forward(self, x: torch.Tensor, router_logits: torch.Tensor, correction_bias: torch.Tensor | None = None,
                unsummed: bool = False) -> torch.Tensor | PairRows:
        """unsummed: quantized experts may leave their pairs unsummed (without tensor parallelism), for the norm after
        the layer to sum (pair_sum.PairRows)."""
        spec = self.spec
        if x.shape[0] == 0:
            return torch.zeros_like(x)
        if x.is_cuda and (spec.num_expert_group or 1) == 1:
            # Imported on first use: Triton fixes at import whether it compiles or interprets its kernels.
            from wick.kernels.topk_routing import topk_routing

            weights, ids = topk_routing(router_logits, spec.top_k, spec.renormalize, spec.scoring, correction_bias,
                                        spec.routed_scaling_factor)
        else:
            weights, ids = select_experts(
                router_logits, spec.top_k, spec.renormalize, spec.scoring, spec.num_expert_group, spec.topk_group,
                spec.group_score, correction_bias, spec.routed_scaling_factor)
        quantized = self.fp8 or self.wna16
        experts = self.packed or (quantized.experts if quantized is not None else {})
        w13, w2 = (experts["w13"], experts["w2"]) if experts else (self.w13_weight, self.w2_weight)
        unsummed = unsummed and tp_world_size() == 1
        if x.is_cuda and self.packed:
            out = fused_experts_gguf(x, w13, w2, weights, ids, unsummed=unsummed)
        elif x.is_cuda and self.fp8 is not None:
            out = fused_experts_fp8(x, w13, w2, weights, ids, unsummed=unsummed)
        elif x.is_cuda and self.wna16 is not None:
            out = fused_experts_wna16(x, w13, w2, weights, ids, unsummed=unsummed)
        elif x.is_cuda:
            out = fused_experts_float(x, w13, w2, weights, ids)
        else:
            out = fused_experts_ref(x, w13, w2, weights, ids)
        return out if unsummed else tp_all_reduce(out)
