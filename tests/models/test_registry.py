from __future__ import annotations

import sys

import pytest

from wick.models.base import DecoderForCausalLM
from wick.models.llama import LlamaForCausalLM
from wick.models.qwen2 import Qwen2ForCausalLM
from wick.models.qwen3 import Qwen3ForCausalLM
from wick.models.registry import get_model_class, supported_architectures


def test_known_architectures() -> None:
    assert get_model_class(["MistralForCausalLM"]) is LlamaForCausalLM
    assert get_model_class(["LlamaForCausalLM"]) is LlamaForCausalLM
    assert get_model_class(["Qwen2ForCausalLM"]) is Qwen2ForCausalLM
    assert get_model_class(["Qwen3ForCausalLM"]) is Qwen3ForCausalLM


@pytest.mark.parametrize("name", supported_architectures())
def test_every_registered_architecture_resolves_to_its_class(name: str) -> None:
    cls = get_model_class(["SomethingElse", name])
    assert issubclass(cls, DecoderForCausalLM)


def test_model_modules_are_imported_on_first_use() -> None:
    sys.modules.pop("wick.models.gemma3", None)
    sys.modules.pop("wick.models.gemma2", None)
    import wick.models.registry  # noqa: F401

    assert "wick.models.gemma3" not in sys.modules
    get_model_class(["Gemma3ForCausalLM"])
    assert "wick.models.gemma3" in sys.modules


def test_unknown_architecture_is_one_line_naming_it_and_the_supported() -> None:
    with pytest.raises(ValueError) as info:
        get_model_class(["GPT2LMHeadModel"])
    message = str(info.value)
    assert "\n" not in message and "GPT2LMHeadModel" in message
    assert all(name in message for name in supported_architectures())
    with pytest.raises(ValueError, match="supported: "):
        get_model_class([])


def test_embedding_architectures() -> None:
    from wick.models.bert import BertModel

    assert get_model_class(["BertModel"], "embed") is BertModel
    with pytest.raises(ValueError, match="BertModel has no LM head"):
        get_model_class(["BertModel"])
    embedder = get_model_class(["Qwen3ForCausalLM"], "embed")
    assert issubclass(embedder, Qwen3ForCausalLM) and embedder is get_model_class(["Qwen3Model"], "embed")
    assert not embedder.supports_cuda_graph
