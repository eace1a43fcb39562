"""Gemma 3 (text): Gemma 2 with q/k norms, no attention soft-cap, and its own RoPE base (and scaling)
for the local and the global layers. The multimodal releases serve as their language model alone."""

from __future__ import annotations

from wick.layers.norm import GemmaRMSNorm
from wick.models.gemma2 import Gemma2ForCausalLM


class Gemma3ForCausalLM(Gemma2ForCausalLM):
    qk_norm = GemmaRMSNorm

    def checkpoint_name(self, name: str) -> str | None:
        """The multimodal checkpoints (4B-27B) hold the language model under language_model. (on disk)
        or model.language_model. (transformers 5); their vision tower and projector are not loaded."""
        for prefix, ours in (("language_model.model.", "model."), ("model.language_model.", "model."),
                             ("language_model.lm_head.", "lm_head.")):
            if name.startswith(prefix):
                return ours + name[len(prefix):]
        if name.startswith(("vision_tower.", "multi_modal_projector.", "model.vision_tower.",
                            "model.multi_modal_projector.")):
            return None
        return name
