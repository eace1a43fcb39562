"""Llama and the decoders that are Llama in all but options: Mistral, Yi, SmolLM, the DeepSeek-R1 Llama
distills. Pre-norm layers of grouped-query attention with RoPE and a SwiGLU MLP."""

from __future__ import annotations

from wick.models.base import DecoderForCausalLM


class LlamaForCausalLM(DecoderForCausalLM):
    pass
