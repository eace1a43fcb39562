"""A decoder family used as an embedding model (Qwen3-Embedding: Qwen3 weights, last-token pooling): the
family's class without its LM head. Its checkpoint may be a `*Model` one, whose names lack the `model.` prefix."""

from __future__ import annotations

import functools

from transformers import PretrainedConfig

from wick.models.base import DecoderForCausalLM


@functools.cache
def as_embedding_model(cls: type[DecoderForCausalLM]) -> type[DecoderForCausalLM]:
    class EmbeddingModel(cls):  # type: ignore[valid-type, misc]
        # Every step is a whole prompt: no decode step to capture.
        supports_cuda_graph = False

        def __init__(self, config: PretrainedConfig) -> None:
            super().__init__(config)
            del self.lm_head

        def checkpoint_name(self, name: str) -> str | None:
            if name.startswith("lm_head."):
                return None
            if not name.startswith("model."):
                name = f"model.{name}"
            return super().checkpoint_name(name)

    EmbeddingModel.__name__ = EmbeddingModel.__qualname__ = f"{cls.__name__}AsEmbedding"
    return EmbeddingModel
