"""Qwen3-MoE (Qwen3-30B-A3B, Qwen3-235B-A22B): Qwen3 attention with routed experts."""

from __future__ import annotations

from wick.layers.norm import RMSNorm
from wick.models.base import DecoderForCausalLM


class Qwen3MoeForCausalLM(DecoderForCausalLM):
    qk_norm = RMSNorm
