"""StableLM 2: LayerNorm with biases, partial RoPE, optional q/k/v biases."""

from __future__ import annotations

from transformers import PretrainedConfig

from wick.layers.norm import LayerNorm
from wick.models.base import DecoderForCausalLM
from wick.models.config import ModelConfig


class StableLmForCausalLM(DecoderForCausalLM):
    norm = LayerNorm

    @classmethod
    def model_config(cls, config: PretrainedConfig) -> ModelConfig:
        for option in ("use_parallel_residual", "qk_layernorm"):
            if getattr(config, option, False):
                raise ValueError(f"StableLM with {option}=True is not supported")
        return ModelConfig.from_hf(config, qkv_bias=config.use_qkv_bias, o_bias=False)
