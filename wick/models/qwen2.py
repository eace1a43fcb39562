"""Qwen2 (and the DeepSeek-R1 Qwen distills): Llama with biases on the q, k and v projections."""

from __future__ import annotations

from transformers import PretrainedConfig

from wick.models.base import DecoderForCausalLM
from wick.models.config import ModelConfig


class Qwen2ForCausalLM(DecoderForCausalLM):
    @classmethod
    def model_config(cls, config: PretrainedConfig) -> ModelConfig:
        return ModelConfig.from_hf(config, qkv_bias=True, o_bias=False)
