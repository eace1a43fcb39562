"""MoE experts of GPTQ and AWQ checkpoints: 4- or 8-bit weights with group scales and zero points (W4A16 / W8A16).

A checkpoint stores each expert's gate, up and down projections as a GPTQ or AWQ linear layer stores its weight
(`qweight`, `qzeros`, `scales`, GPTQ's `g_idx`). They load into one stacked tensor of each per layer, this rank's shard
of each (gate and up split along their outputs, down along its inputs), and are brought at load to one layout, GPTQ's:
w13 [E, H / pack, 2I] int32 (gate columns, then up columns) and w2 [E, I / pack, H], each word holding `pack` = 32 /
bits consecutive input rows, with scales and zero points (as values) [E, groups, N] in the model's dtype. On a GPU up to
EXPERT_GEMV_MAX_PAIRS (token, expert) pairs (decode, and EXPERT_GEMV_PAIRS_PER_EXPERT an expert) run the W4A16 GEMV,
each pair's expert chosen inside it; more pairs run the fused MoE kernel's tiles over the pairs sorted by expert. On the
CPU the reference dequantizes each expert a token chose as it meets it. Act-order checkpoints (GPTQ `desc_act` with
groups out of row order) are refused: each expert would need its own permutation of the activations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from wick.kernels.wna16_matmul import pack_rows, wna16_dequantize
from wick.layers.quantization.awq import AWQConfig, awq_unpack
from wick.layers.quantization.gptq import GPTQConfig, fill_dummy_wna16, splat, unpack_columns

if TYPE_CHECKING:
    from wick.kernels.fused_moe import GroupScales
    from wick.kernels.pair_sum import PairRows
    from wick.layers.moe.fused_moe import FusedMoE

# (token, expert) pairs up to which the GEMVs run (each pair reads its expert), and no more than
# EXPERT_GEMV_PAIRS_PER_EXPERT times the experts; past them the tiles read each expert once a tile of its pairs. 4-bit
# experts on an H100 (benchmarks/kernels/bench_fused_moe.py --wna16 4): Qwen3-30B-A3B's (128), GEMVs 301 against
# tiles 565 us at 512 pairs, 573 against 571 at 1,024; Mixtral's shape (8), 702 against 812 at 32 pairs, 1,283
# against 814 at 64.
EXPERT_GEMV_MAX_PAIRS = 512
EXPERT_GEMV_PAIRS_PER_EXPERT = 4
_TENSORS = ("qweight", "qzeros", "scales", "g_idx")


@dataclass
class Wna16Experts:
    """`qweight` [experts, K / (32 / bits), N] int32, `scales` and `zeros` [experts, ceil(K / group), N] in `dtype`:
    expert e's matrix [N, K] is (q - zeros) * scales of its rows' groups, transposed."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor
    bits: int
    group: int

    @property
    def shape(self) -> tuple[int, int, int]:
        experts, words, n = self.qweight.shape
        return experts, n, words * (32 // self.bits)

    @property
    def group_scales(self) -> GroupScales:
        from wick.kernels.fused_moe import GroupScales

        return GroupScales(self.scales, self.zeros, self.bits, self.group)

    def __getitem__(self, expert: int) -> torch.Tensor:
        """One expert's matrix [N, K] in the scales' dtype."""
        k = self.shape[2]
        g_idx = torch.arange(k, device=self.qweight.device) // self.group
        return wna16_dequantize(self.qweight[expert], self.scales[expert], self.zeros[expert], g_idx, self.bits).t()

    def dequantize_all(self) -> torch.Tensor:
        return torch.stack([self[expert] for expert in range(self.shape[0])])


def _param(shape: tuple[int, ...], dtype: torch.dtype, k_dim: int | None, k_pack: int, n_pack: int | None,
           optional: bool = False) -> nn.Parameter:
    """A stacked parameter of a checkpoint tensor whose dimension k_dim (of one expert's tensor; None: whole)
    holds input rows k_pack at a time and whose last one output columns n_pack at a time (None: no output
    dimension)."""
    param = nn.Parameter(torch.empty(shape, dtype=dtype), requires_grad=False)
    param.k_dim, param.k_pack, param.n_pack, param.optional = k_dim, k_pack, n_pack, optional
    return param


class Wna16ExpertWeights:
    """Creates an MoE layer's GPTQ or AWQ expert parameters in their checkpoint shapes (w13_qweight, w13_qzeros,
    w13_scales, w13_g_idx and w2's), loads each expert's shards into them, and brings them to the kernels' layout
    after loading (`experts`)."""

    def __init__(self, config: GPTQConfig | AWQConfig, layer: FusedMoE) -> None:
        self.config = config
        self.awq = isinstance(config, AWQConfig)
        self.bits = 4 if self.awq else config.bits
        self.layer = layer
        e, i, h = layer.spec.num_experts, layer.intermediate_size, layer.hidden_size
        pack = 32 // self.bits
        name = config.name.upper()
        if config.group_size != -1 and (config.group_size % 16 or config.group_size % pack):
            raise ValueError(f"{name} experts in groups of {config.group_size} are not supported: the group size "
                             "must be a multiple of 16")
        if h % pack or i % pack or (layer.tp_size > 1 and config.group_size != -1 and i % config.group_size):
            raise ValueError(f"{name} experts need the hidden size ({h}) and the expert intermediate size on each "
                             f"rank ({i}) to be multiples of {pack}"
                             + (f" and the latter of the group size {config.group_size}" if layer.tp_size > 1 else ""))
        self.groups = {"w13": config.group_size if config.group_size != -1 else h,
                       "w2": config.group_size if config.group_size != -1 else i}
        for prefix, k, n in (("w13", h, 2 * i), ("w2", i, h)):
            group = self.groups[prefix]
            groups = -(-k // group)
            group_k = None if config.group_size == -1 else 0
            if self.awq:  # qweight [K, N / 8] in AWQ's column order
                params = {"qweight": _param((e, k, n // pack), torch.int32, 0, 1, pack),
                          "qzeros": _param((e, groups, n // pack), torch.int32, group_k, group, pack),
                          "scales": _param((e, groups, n), torch.float16, group_k, group, 1)}
            else:
                params = {"qweight": _param((e, k // pack, n), torch.int32, 0, pack, 1),
                          "qzeros": _param((e, groups, n // pack), torch.int32, group_k, group, pack),
                          "scales": _param((e, groups, n), torch.float16, group_k, group, 1),
                          "g_idx": _param((e, k), torch.int32, 0, 1, None, optional=not config.desc_act)}
            for suffix, param in params.items():
                param.weight_loader = self._load
                setattr(layer, f"{prefix}_{suffix}", param)
        self.experts: dict[str, Wna16Experts] = {}

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: tuple[str, int | None]) -> None:
        """One expert's checkpoint tensor of its gate, up or down projection: this rank's columns of gate and up
        (their output features), its rows of down (its input features)."""
        kind, expert = shard_id
        if expert is None or kind not in ("gate", "up", "down"):
            raise ValueError(f"{self.config.name.upper()} experts stacked as {kind!r} are not supported")
        layer = self.layer
        i, start = layer.intermediate_size, layer.tp_rank * layer.intermediate_size
        target = param.data[expert]
        if kind == "down":
            source = loaded
            if param.k_dim is not None and layer.tp_size > 1:
                source = loaded.narrow(param.k_dim, start // param.k_pack, target.shape[param.k_dim])
        elif param.n_pack is None:  # g_idx of gate or up: over the hidden size, which no rank splits
            source = loaded
        else:
            columns = i // param.n_pack
            source = loaded.narrow(-1, start // param.n_pack, columns)
            target = target.narrow(-1, 0 if kind == "gate" else columns, columns)
        if source.shape != target.shape:
            raise ValueError(f"expert {expert}'s {kind} tensor has shape {tuple(loaded.shape)}, which does not fit "
                             f"{tuple(target.shape)} on this rank")
        target.copy_(source)

    def process_weights_after_loading(self) -> None:
        """The packed words in GPTQ's layout, the zero points unpacked to values, the scales in the model's dtype;
        act-order groups refused."""
        layer, dtype = self.layer, self.layer.params_dtype
        for prefix in ("w13", "w2"):
            qweight, qzeros, scales = (getattr(layer, f"{prefix}_{suffix}") for suffix in _TENSORS[:3])
            if self.awq:
                qweight.data = torch.stack([pack_rows(awq_unpack(words), self.bits) for words in qweight.data])
                zeros = torch.stack([awq_unpack(words) for words in qzeros.data])
                if not self.config.zero_point:
                    zeros.zero_()
            else:
                self._check_groups(prefix)
                zeros = torch.stack([unpack_columns(words, self.bits) for words in qzeros.data]) + \
                    self.config.zero_offset
                delattr(layer, f"{prefix}_g_idx")
            qzeros.data = zeros.to(dtype)
            scales.data = scales.data.to(dtype)
            self.experts[prefix] = Wna16Experts(qweight.data, scales.data, qzeros.data, self.bits, self.groups[prefix])

    def _expected_g_idx(self, prefix: str) -> torch.Tensor:
        """The group of each of this rank's input rows of w13 or w2 where groups run in row order."""
        layer = self.layer
        start = layer.tp_rank * layer.intermediate_size if prefix == "w2" else 0
        rows = getattr(layer, f"{prefix}_g_idx").shape[1]
        if self.config.group_size == -1:
            return torch.zeros(rows, dtype=torch.int32)
        return (torch.arange(start, start + rows, dtype=torch.int32) // self.config.group_size)

    def _check_groups(self, prefix: str) -> None:
        """Without desc_act groups run in row order (g_idx may be left out, and is not read)."""
        if not self.config.desc_act:
            return
        g_idx = getattr(self.layer, f"{prefix}_g_idx").data
        if not torch.equal(g_idx, self._expected_g_idx(prefix).to(g_idx.device).expand_as(g_idx)):
            raise ValueError("GPTQ experts with act-order groups (desc_act, g_idx out of row order) are not "
                             "supported; use a checkpoint quantized without desc_act or with group_size -1")

    def initialize_dummy(self, generator: torch.Generator, high: float) -> None:
        """Random words in the checkpoint's layout whose weights lie within about [-high, high]."""
        layer = self.layer
        center = 1 << (self.bits - 1)
        for prefix in ("w13", "w2"):
            fill_dummy_wna16(getattr(layer, f"{prefix}_qweight").data, getattr(layer, f"{prefix}_scales").data,
                             generator, self.bits, high)
            zero = center if self.awq else center - self.config.zero_offset
            getattr(layer, f"{prefix}_qzeros").data.fill_(splat(zero, self.bits))
            if not self.awq:
                getattr(layer, f"{prefix}_g_idx").data.copy_(self._expected_g_idx(prefix))


def fused_experts_wna16(x: torch.Tensor, w13: Wna16Experts, w2: Wna16Experts, topk_weights: torch.Tensor,
                        topk_ids: torch.Tensor, path: str | None = None, unsummed: bool = False
                        ) -> torch.Tensor | PairRows:
    """fused_experts (wick/kernels/fused_moe.py) over GPTQ/AWQ experts, on a GPU. path (for benchmarks; None picks):
    "gemv", the W4A16 / W8A16 GEMVs, up to EXPERT_GEMV_MAX_PAIRS pairs and EXPERT_GEMV_PAIRS_PER_EXPERT an expert;
    "tiles", the fused MoE kernel.
    unsummed: the GEMVs' pairs are left unsummed (pair_sum.PairRows), for the norm after the layer to sum."""
    from wick.kernels.activation import act_and_mul_q8, silu_and_mul
    from wick.kernels.fused_moe import fused_experts, pair_bound
    from wick.kernels.pair_sum import summed_unless
    from wick.kernels.wna16_matmul import expert_takes_int8_rows, wna16_expert_gemv

    tokens, top_k = topk_ids.shape
    if path is None:
        bound = pair_bound(EXPERT_GEMV_MAX_PAIRS, EXPERT_GEMV_PAIRS_PER_EXPERT, w13.qweight.shape[0])
        path = "gemv" if tokens * top_k <= bound else "tiles"
    if path == "tiles":
        return fused_experts(x, w13.qweight, w2.qweight, topk_weights, topk_ids, w13_scales=w13.group_scales,
                             w2_scales=w2.group_scales)
    ids = topk_ids.flatten()
    gate_up = wna16_expert_gemv(x, w13.qweight, w13.scales, w13.zeros, w13.bits, w13.group, ids, top_k)
    # an int8 down GEMV takes its rows rounded by the activation kernel: no rounding kernel between them
    int8 = expert_takes_int8_rows(w2.bits, w2.group, gate_up.shape[-1] // 2)
    act = act_and_mul_q8(gate_up, "silu", interleave=True) if int8 else silu_and_mul(gate_up)
    down = wna16_expert_gemv(act, w2.qweight, w2.scales, w2.zeros, w2.bits, w2.group, ids, 1, dtype=x.dtype)
    return summed_unless(down, topk_weights, unsummed)
