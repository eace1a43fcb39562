"""Phi-3 and Phi-4: Llama with merged qkv and gate/up checkpoint tensors, partial RoPE (Phi-4-mini)
and LongRoPE."""

from __future__ import annotations

from wick.models.base import DecoderForCausalLM


class Phi3ForCausalLM(DecoderForCausalLM):
    pass
