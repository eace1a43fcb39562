"""Qwen2-MoE (Qwen1.5-MoE, Qwen2-57B-A14B): Qwen2 with routed experts and a sigmoid-gated shared expert."""

from __future__ import annotations

from transformers import PretrainedConfig

from wick.models.base import DecoderForCausalLM
from wick.models.config import ModelConfig


class Qwen2MoeForCausalLM(DecoderForCausalLM):
    @classmethod
    def model_config(cls, config: PretrainedConfig) -> ModelConfig:
        return ModelConfig.from_hf(config, qkv_bias=getattr(config, "qkv_bias", True), o_bias=False)
