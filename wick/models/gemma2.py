"""Gemma 2: sandwich norms of (1 + w) RMSNorm around attention and MLP, a scaled embedding, GELU-tanh,
attention and final-logit soft-capping, alternating sliding-window and global layers."""

from __future__ import annotations

from transformers import PretrainedConfig

from wick.layers.norm import GemmaRMSNorm
from wick.models.base import DecoderForCausalLM
from wick.models.blocks import GEMMA_NORMS
from wick.models.config import ModelConfig


class Gemma2ForCausalLM(DecoderForCausalLM):
    norm = GemmaRMSNorm
    norm_layout = GEMMA_NORMS
    embed_scale = True

    @classmethod
    def model_config(cls, config: PretrainedConfig) -> ModelConfig:
        return ModelConfig.from_hf(config, attn_scale=config.query_pre_attn_scalar**-0.5)
