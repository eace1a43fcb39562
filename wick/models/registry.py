"""Hugging Face architecture names -> (module under wick.models, class), imported on first use."""

from __future__ import annotations

import importlib

from torch import nn

_MODELS: dict[str, tuple[str, str]] = {
    "LlamaForCausalLM": ("llama", "LlamaForCausalLM"),
    "LLaMAForCausalLM": ("llama", "LlamaForCausalLM"),
    "MistralForCausalLM": ("llama", "LlamaForCausalLM"),
    "Qwen2ForCausalLM": ("qwen2", "Qwen2ForCausalLM"),
    "Qwen3ForCausalLM": ("qwen3", "Qwen3ForCausalLM"),
    "Gemma2ForCausalLM": ("gemma2", "Gemma2ForCausalLM"),
    "Gemma3ForCausalLM": ("gemma3", "Gemma3ForCausalLM"),
    "Phi3ForCausalLM": ("phi3", "Phi3ForCausalLM"),
    "Glm4ForCausalLM": ("glm4", "Glm4ForCausalLM"),
    "StableLmForCausalLM": ("stablelm", "StableLmForCausalLM"),
    "MixtralForCausalLM": ("mixtral", "MixtralForCausalLM"),
    "Qwen2MoeForCausalLM": ("qwen2_moe", "Qwen2MoeForCausalLM"),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "Qwen3MoeForCausalLM"),
    "DeepseekV2ForCausalLM": ("deepseek_v2", "DeepseekV2ForCausalLM"),
    "DeepseekV3ForCausalLM": ("deepseek_v2", "DeepseekV3ForCausalLM"),
}
# Architectures without an LM head: they serve embeddings only (the second field: the decoder family's class,
# used as an embedding model).
_EMBEDDING_MODELS: dict[str, tuple[str, str]] = {
    "BertModel": ("bert", "BertModel"),
    "Qwen3Model": ("qwen3", "Qwen3ForCausalLM"),
}


def supported_architectures() -> list[str]:
    return sorted(_MODELS)


def embedding_architectures() -> list[str]:
    """The architectures that only embed; every generative one embeds too with task "embed"."""
    return sorted(_EMBEDDING_MODELS)


def is_embedding_only(architectures: list[str]) -> bool:
    """Whether the config names an architecture that can only embed (no LM head)."""
    return any(name in _EMBEDDING_MODELS for name in architectures)


def get_model_class(architectures: list[str], task: str = "generate") -> type[nn.Module]:
    """The class for the config's architectures; with `task="embed"` a decoder family comes without its LM head
    (its hidden states are pooled)."""
    from wick.models.base import DecoderForCausalLM
    from wick.models.embedding import as_embedding_model

    for name in architectures:
        if name in _MODELS or name in _EMBEDDING_MODELS:
            module, cls_name = _MODELS.get(name) or _EMBEDDING_MODELS[name]
            cls = getattr(importlib.import_module(f"wick.models.{module}"), cls_name)
            if task == "generate" and name in _EMBEDDING_MODELS:
                raise ValueError(f"{name} has no LM head: it serves embeddings only (--task embed)")
            if task == "embed" and issubclass(cls, DecoderForCausalLM):
                return as_embedding_model(cls)
            return cls
    named = ", ".join(architectures) or "none named in the config"
    raise ValueError(f"unsupported architecture {named}; supported: {', '.join(supported_architectures())}; "
                     f"for embeddings also {', '.join(embedding_architectures())}")
