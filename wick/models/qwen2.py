"""Qwen2: Llama with biases on the q, k and v projections."""

from __future__ import annotations

from transformers import PretrainedConfig

from wick.models.llama import DecoderOptions, LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def decoder_options(config: PretrainedConfig) -> DecoderOptions:
        return DecoderOptions(qkv_bias=True)
