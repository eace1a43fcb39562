"""A multimodal Gemma 3 checkpoint (Gemma3ForConditionalGeneration, as the 4B-27B releases are) serves as
its language model: the folder resolves to the text config, the language model's weights load from their
prefixed names, the vision tower is skipped, and greedy tokens and logits match HF's text-only forward."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from paged_generate import PagedRunner
from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig, SiglipVisionConfig

from wick.loader.model_source import resolve_model
from wick.loader.safetensors_loader import iter_safetensors_weights
from wick.models.registry import get_model_class

NEW_TOKENS = 16
pytestmark = pytest.mark.slow


def test_multimodal_gemma3_serves_its_language_model(tmp_path: Path) -> None:
    text = Gemma3TextConfig(vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=8,
                            layer_types=["sliding_attention", "full_attention"], initializer_range=0.3)
    vision = SiglipVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    config = Gemma3Config(text_config=text.to_dict(), vision_config=vision.to_dict(), mm_tokens_per_image=4,
                          image_token_index=299, boi_token_index=297, eoi_token_index=298, eos_token_id=[1, 106])
    torch.manual_seed(0)
    hf = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name:
                param.normal_(0.0, 0.2)
    hf.save_pretrained(tmp_path)

    source = resolve_model(str(tmp_path))
    assert source.config.architectures == ["Gemma3ForCausalLM"] and source.config.vocab_size == 300
    assert source.config.eos_token_id == [1, 106]
    ours = get_model_class(source.config.architectures)(source.config).eval()
    loaded = ours.load_weights(iter_safetensors_weights(str(tmp_path)))
    assert loaded == {name for name, _ in ours.named_parameters()}

    prompt = torch.randint(3, 290, (13,), generator=torch.Generator().manual_seed(1)).tolist()
    (tokens, logits), = PagedRunner(ours).generate([prompt], NEW_TOKENS)
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                          return_dict_in_generate=True, eos_token_id=None)
    assert tokens == out.sequences[0, len(prompt):].tolist()
    torch.testing.assert_close(logits, torch.cat(out.logits), atol=1e-4, rtol=1e-4)
