"""Gemma 3 (text): Gemma 2 with q/k norms, no attention soft-cap, and its own RoPE base (and scaling)
for the local and the global layers."""

from __future__ import annotations

from wick.layers.norm import GemmaRMSNorm
from wick.models.gemma2 import Gemma2ForCausalLM


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    qk_norm = GemmaRMSNorm
