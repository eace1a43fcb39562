"""Mixtral: Mistral with a mixture of experts (softmax top-2, renormalised) for its MLPs."""

from __future__ import annotations

from wick.models.base import DecoderForCausalLM


class MixtralForCausalLM(DecoderForCausalLM):
    def checkpoint_name(self, name: str) -> str | None:
        return name.replace(".block_sparse_moe.", ".mlp.")
