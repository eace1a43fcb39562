"""Qwen3: Llama with a per-head RMSNorm on q and k before RoPE."""

from __future__ import annotations

from transformers import PretrainedConfig

from wick.models.llama import DecoderOptions, LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def decoder_options(config: PretrainedConfig) -> DecoderOptions:
        attention_bias = getattr(config, "attention_bias", False)
        return DecoderOptions(qkv_bias=attention_bias, o_bias=attention_bias, qk_norm=True)
