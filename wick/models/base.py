"""DecoderForCausalLM: a family is this class with its options set, built from the shared blocks.

A family file subclasses it and sets class attributes (the norm, its layout, q/k norms, embedding
scale), overrides `model_config` for what its HF config does not say, `make_mlp` for a different
MLP, and `checkpoint_name` for checkpoint names that differ from ours.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from transformers import PretrainedConfig

from wick.layers.linear import MergedColumnParallelLinear, QKVParallelLinear
from wick.layers.norm import RMSNorm
from wick.layers.vocab_embedding import ParallelLMHead
from wick.models.blocks import (
    DecoderAttention,
    DecoderLayer,
    DecoderModel,
    GatedMLP,
    NormLayout,
    RopeCache,
    SparseMoeBlock,
)
from wick.models.config import ModelConfig

# checkpoint projection -> (our merged parameter, its shard id)
STACKED_PARAMS: dict[str, tuple[str, Any]] = {
    "q_proj": ("qkv_proj", "q"),
    "k_proj": ("qkv_proj", "k"),
    "v_proj": ("qkv_proj", "v"),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
# one expert's matrix on disk: experts.{e}.{gate_proj|up_proj|down_proj} (Mixtral: w1, w3, w2), and an FP8
# checkpoint's scales of it
_EXPERT = re.compile(r"\.experts\.(\d+)\.(gate_proj|up_proj|down_proj|w1|w3|w2)\."
                     r"(weight|weight_scale_inv|weight_scale|input_scale|qweight|qzeros|scales|g_idx)$")
_EXPERT_KIND = {"gate_proj": "gate", "w1": "gate", "up_proj": "up", "w3": "up", "down_proj": "down", "w2": "down"}
# all experts stacked, as transformers 5 holds them: experts.gate_up_proj [E, 2I, H], experts.down_proj [E, H, I]
_STACKED_EXPERTS = {"experts.gate_up_proj": ("w13_weight", "gate_up"), "experts.down_proj": ("w2_weight", "down")}


class DecoderForCausalLM(nn.Module):
    norm: type[nn.Module] = RMSNorm
    norm_layout: NormLayout = NormLayout()
    qk_norm: type[nn.Module] | None = None
    embed_scale: bool = False
    shared_expert_name: str = "shared_expert"
    stacked_params: dict[str, tuple[str, Any]] = STACKED_PARAMS

    def __init__(self, config: PretrainedConfig) -> None:
        super().__init__()
        self.config = config
        cfg = self.model_config(config)
        self.cfg = cfg
        ropes = RopeCache(cfg.head_dim, cfg.max_position)
        layers = [DecoderLayer(cfg, self.make_attention(cfg, i, ropes), self.make_mlp(cfg, i), self.norm,
                               self.norm_layout) for i in range(cfg.num_layers)]
        self.model = DecoderModel(cfg, layers, self.norm, self.embed_scale)
        self.lm_head = ParallelLMHead(cfg.vocab_size, cfg.hidden_size)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def model_config(cls, config: PretrainedConfig) -> ModelConfig:
        return ModelConfig.from_hf(config)

    def make_attention(self, cfg: ModelConfig, layer: int, ropes: RopeCache) -> nn.Module:
        return DecoderAttention(cfg, layer, ropes.get(cfg.rope[layer]), self.qk_norm)

    def make_mlp(self, cfg: ModelConfig, layer: int) -> nn.Module:
        if cfg.moe is not None and cfg.moe_layers[layer]:
            return SparseMoeBlock(cfg.moe, cfg.hidden_size, cfg.hidden_act, self.shared_expert_name)
        return GatedMLP(cfg.hidden_size, cfg.intermediate_size, cfg.hidden_act, cfg.mlp_bias)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids, positions)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = self.lm_head(hidden_states)
        cap = self.cfg.final_logit_softcap
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def checkpoint_name(self, name: str) -> str | None:
        """Our name for a checkpoint tensor's name; None to skip the tensor."""
        return name

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Loads Hugging Face checkpoint tensors; returns the names of the parameters loaded."""
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for checkpoint_name, tensor in weights:
            name = self.checkpoint_name(checkpoint_name)
            if name is None or "rotary_emb.inv_freq" in name:
                continue
            if self.cfg.tie_word_embeddings and name == "lm_head.weight":
                continue
            name, shard_id = _our_name(name, self.stacked_params)
            if name not in params:
                raise KeyError(f"checkpoint tensor {checkpoint_name!r} has no parameter in {type(self).__name__}")
            param = params[name]
            if shard_id is None and _is_merged(param):
                _load_fused(param, tensor)
            else:
                param.weight_loader(param, tensor, shard_id)
            loaded.add(name)
        return loaded


def _our_name(name: str, stacked_params: dict[str, tuple[str, Any]]) -> tuple[str, Any]:
    """(our parameter name, the shard id its weight loader takes) of a checkpoint name."""
    match = _EXPERT.search(name)
    if match:
        expert, proj, suffix = int(match.group(1)), match.group(2), match.group(3)
        kind = _EXPERT_KIND[proj]
        ours = f"{'w2' if kind == 'down' else 'w13'}_{suffix}"
        return f"{name[:match.start()]}.experts.{ours}", (kind, expert)
    for suffix, (ours, kind) in _STACKED_EXPERTS.items():
        if name.endswith(suffix):
            return f"{name[:-len(suffix)]}experts.{ours}", (kind, None)
    parts = name.split(".")
    if len(parts) > 2 and parts[-2] in stacked_params:
        parts[-2], shard_id = stacked_params[parts[-2]]
        return ".".join(parts), shard_id
    return name, None


def _is_merged(param: nn.Parameter) -> bool:
    owner = getattr(param.weight_loader, "__self__", None)
    return isinstance(owner, (MergedColumnParallelLinear, QKVParallelLinear))


def _load_fused(param: nn.Parameter, tensor: torch.Tensor) -> None:
    """A checkpoint tensor that is already merged (Phi-3's qkv_proj, GLM-4's gate_up_proj): split it."""
    owner = param.weight_loader.__self__
    if isinstance(owner, QKVParallelLinear):
        heads, kv_heads = owner.num_heads * owner.tp_size, owner.num_kv_heads * owner.tp_size // owner.kv_replicas
        sizes = [heads * owner.head_size, kv_heads * owner.head_size, kv_heads * owner.head_size]
        shard_ids: list[Any] = ["q", "k", "v"]
    else:
        # output_sizes are this rank's; the checkpoint holds every rank's.
        sizes = [size * owner.tp_size for size in owner.output_sizes]
        shard_ids = list(range(len(owner.output_sizes)))
    for shard_id, part in zip(shard_ids, tensor.split(sizes, dim=0), strict=True):
        param.weight_loader(param, part, shard_id)
