"""DeepSeek V2 and V3: multi-head latent attention over a compressed paged KV cache, and a mixture of
experts with shared experts (V2: softmax, optionally group-limited; V3: sigmoid grouped top-k with a
correction bias) after the first dense layers."""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn
from transformers import PretrainedConfig

from wick.distributed.communication import tp_world_size
from wick.layers.attention.mla import MLAAttention
from wick.layers.linear import ColumnParallelLinear, RowParallelLinear, divide
from wick.layers.norm import RMSNorm
from wick.layers.quantization.base import current_quantization
from wick.layers.replicated_linear import ReplicatedLinear
from wick.layers.rotary import RotaryEmbedding
from wick.models.base import STACKED_PARAMS, DecoderForCausalLM
from wick.models.blocks import RopeCache
from wick.models.config import MlaSpec, ModelConfig

LATENT_NORM_EPS = 1e-6  # the q and kv latents' RMSNorms keep their default eps in every release


def _yarn_mscale(factor: float, mscale: float) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


class DeepseekV2Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, rope: RotaryEmbedding) -> None:
        super().__init__()
        mla = cfg.mla
        assert mla is not None
        quantization = current_quantization()
        if quantization is not None:
            # MLA reads kv_b_proj's weight as a float matrix (absorbed into query and output)
            raise ValueError(f"{quantization.describe()} weights are not supported for MLA (DeepSeek) models yet")
        self.mla = mla
        self.num_heads = divide(cfg.num_heads, tp_world_size())
        qk_head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        if mla.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(cfg.hidden_size, cfg.num_heads * qk_head_dim)
        else:
            self.q_a_proj = ReplicatedLinear(cfg.hidden_size, mla.q_lora_rank, bias=cfg.qkv_bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = ColumnParallelLinear(mla.q_lora_rank, cfg.num_heads * qk_head_dim)
        self.kv_a_proj_with_mqa = ReplicatedLinear(cfg.hidden_size, mla.kv_lora_rank + mla.qk_rope_head_dim,
                                                   bias=cfg.qkv_bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = ColumnParallelLinear(mla.kv_lora_rank,
                                              cfg.num_heads * (mla.qk_nope_head_dim + mla.v_head_dim))
        self.o_proj = RowParallelLinear(cfg.num_heads * mla.v_head_dim, cfg.hidden_size, bias=cfg.o_bias)
        self.rotary_emb = rope
        self.attn = MLAAttention(self.num_heads, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim,
                                 mla.v_head_dim, cfg.attn_scale)

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        mla = self.mla
        if mla.q_lora_rank is None:
            q = self.q_proj(hidden_states)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden_states)))
        q_nope, q_pe = q.view(-1, self.num_heads, mla.qk_nope_head_dim + mla.qk_rope_head_dim).split(
            [mla.qk_nope_head_dim, mla.qk_rope_head_dim], dim=-1)
        latent, k_pe = self.kv_a_proj_with_mqa(hidden_states).split([mla.kv_lora_rank, mla.qk_rope_head_dim],
                                                                     dim=-1)
        q_pe, k_pe = self.rotary_emb(positions, q_pe.contiguous(), k_pe.contiguous())
        out = self.attn(q_nope, q_pe.view(-1, self.num_heads, mla.qk_rope_head_dim),
                        self.kv_a_layernorm(latent.contiguous()), k_pe, self.kv_b_proj.weight)
        return self.o_proj(out)


class DeepseekV2ForCausalLM(DecoderForCausalLM):
    shared_expert_name = "shared_experts"
    stacked_params = {k: v for k, v in STACKED_PARAMS.items() if v[0] == "gate_up_proj"}  # q_proj stays whole
    # MLA attends through host-side per-request loops, which a CUDA graph cannot replay
    supports_cuda_graph = False

    @classmethod
    def model_config(cls, config: PretrainedConfig) -> ModelConfig:
        mla = MlaSpec(q_lora_rank=config.q_lora_rank, kv_lora_rank=config.kv_lora_rank,
                      qk_nope_head_dim=config.qk_nope_head_dim, qk_rope_head_dim=config.qk_rope_head_dim,
                      v_head_dim=config.v_head_dim)
        cfg = ModelConfig.from_hf(config, head_dim=mla.qk_rope_head_dim, mla=mla)
        # V2 and V3 rotate interleaved pairs (V3 unless rope_interleave is off) of the rope dims only
        neox = config.model_type == "deepseek_v3" and not getattr(config, "rope_interleave", True)
        rope = [dataclasses.replace(r, rotary_dim=mla.qk_rope_head_dim, is_neox=neox) for r in cfg.rope]
        scale = (mla.qk_nope_head_dim + mla.qk_rope_head_dim) ** -0.5
        scaling = rope[0].scaling
        if scaling is not None and scaling.get("mscale_all_dim"):
            scale *= _yarn_mscale(scaling["factor"], scaling["mscale_all_dim"]) ** 2
        moe = cfg.moe
        if moe is not None and config.model_type == "deepseek_v2":
            moe = dataclasses.replace(moe, renormalize=False)  # V2 never renormalises (as HF's router)
        return dataclasses.replace(cfg, rope=rope, attn_scale=scale, moe=moe)

    def make_attention(self, cfg: ModelConfig, layer: int, ropes: RopeCache) -> nn.Module:
        return DeepseekV2Attention(cfg, ropes.get(cfg.rope[layer]))

    def checkpoint_name(self, name: str) -> str | None:
        parts = name.split(".")
        # V3's multi-token-prediction layers sit past the last decoder layer: not used for decoding
        if len(parts) > 2 and parts[1] == "layers" and int(parts[2]) >= self.cfg.num_layers:
            return None
        return name


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    pass
