"""Qwen3: Llama with a per-head RMSNorm on q and k before RoPE."""

from __future__ import annotations

from wick.layers.norm import RMSNorm
from wick.models.base import DecoderForCausalLM


class Qwen3ForCausalLM(DecoderForCausalLM):
    qk_norm = RMSNorm
