"""Hugging Face architecture names -> our model classes."""

from __future__ import annotations

from torch import nn

from wick.models.llama import LlamaForCausalLM
from wick.models.qwen2 import Qwen2ForCausalLM
from wick.models.qwen3 import Qwen3ForCausalLM

_MODELS: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "LLaMAForCausalLM": LlamaForCausalLM,
    "MistralForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
    "Qwen3ForCausalLM": Qwen3ForCausalLM,
}


def get_model_class(architectures: list[str]) -> type[nn.Module]:
    for name in architectures:
        if name in _MODELS:
            return _MODELS[name]
    raise ValueError(f"unsupported architectures {architectures}; supported: {', '.join(sorted(_MODELS))}")
