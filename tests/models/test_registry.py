from __future__ import annotations

import pytest

from wick.models.llama import LlamaForCausalLM
from wick.models.qwen2 import Qwen2ForCausalLM
from wick.models.qwen3 import Qwen3ForCausalLM
from wick.models.registry import get_model_class


def test_known_architectures() -> None:
    assert get_model_class(["MistralForCausalLM"]) is LlamaForCausalLM
    assert get_model_class(["LlamaForCausalLM"]) is LlamaForCausalLM
    assert get_model_class(["Qwen2ForCausalLM"]) is Qwen2ForCausalLM
    assert get_model_class(["Qwen3ForCausalLM"]) is Qwen3ForCausalLM


def test_unknown_architecture_lists_supported() -> None:
    with pytest.raises(ValueError, match="supported: .*Qwen3ForCausalLM"):
        get_model_class(["GPT2LMHeadModel"])
    with pytest.raises(ValueError):
        get_model_class([])
