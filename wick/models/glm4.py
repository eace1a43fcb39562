"""GLM-4 (0414): extra norms after attention and MLP, GPT-J style RoPE on half of each head, q/k/v biases."""

from __future__ import annotations

import dataclasses

from transformers import PretrainedConfig

from wick.models.base import DecoderForCausalLM
from wick.models.blocks import GLM4_NORMS
from wick.models.config import ModelConfig


class Glm4ForCausalLM(DecoderForCausalLM):
    norm_layout = GLM4_NORMS

    @classmethod
    def model_config(cls, config: PretrainedConfig) -> ModelConfig:
        cfg = ModelConfig.from_hf(config, o_bias=False)
        return dataclasses.replace(cfg, rope=[dataclasses.replace(r, is_neox=False) for r in cfg.rope])
