"""get_tokenizer (folders, HF ids, GGUF files) and eos_token_ids."""

from __future__ import annotations

import copy
import os

import pytest
from transformers import GenerationConfig, PreTrainedTokenizerBase

import wick.tokenizer.tokenizer as tokenizer_module
from wick.tokenizer.tokenizer import eos_token_ids, get_tokenizer, gguf_chat_template


def test_gguf_tokenizers_carry_tokens_and_template(smollm2_gguf: str,
                                                   smollm2_tokenizer: PreTrainedTokenizerBase,
                                                   qwen_tokenizer: PreTrainedTokenizerBase) -> None:
    template = gguf_chat_template(smollm2_gguf)  # reading Qwen's metadata takes seconds more
    assert template and smollm2_tokenizer.chat_template == template
    assert qwen_tokenizer.chat_template.startswith("{%- if tools %}")
    for tokenizer in (smollm2_tokenizer, qwen_tokenizer):
        assert tokenizer.eos_token == "<|im_end|>"
        assert tokenizer.encode("hi", add_special_tokens=True) == tokenizer.encode("hi", add_special_tokens=False)
    assert smollm2_tokenizer.bos_token == "<|im_start|>" and len(smollm2_tokenizer) == 49152
    assert qwen_tokenizer.convert_tokens_to_ids(["<|im_start|>", "<|endoftext|>"]) == [151644, 151643]
    assert qwen_tokenizer.decode(qwen_tokenizer.encode("<|im_start|>user\nhé 日本<|im_end|>"),
                                 skip_special_tokens=True) == "user\nhé 日本"


def test_gguf_named_as_folder_and_file(smollm2_gguf: str, smollm2_tokenizer: PreTrainedTokenizerBase) -> None:
    folder, name = os.path.split(smollm2_gguf)
    tokenizer = get_tokenizer(folder, gguf_file=name)
    assert tokenizer.get_vocab() == smollm2_tokenizer.get_vocab()
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        get_tokenizer(folder, gguf_file="missing.gguf")
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        get_tokenizer(os.path.join(folder, "missing.gguf"))


def test_chat_template_taken_from_gguf_metadata_when_transformers_drops_it(
        smollm2_gguf: str, smollm2_tokenizer: PreTrainedTokenizerBase, monkeypatch: pytest.MonkeyPatch) -> None:
    without_template = copy.copy(smollm2_tokenizer)
    without_template.chat_template = None

    class NoTemplateAutoTokenizer:
        @staticmethod
        def from_pretrained(*args: object, **kwargs: object) -> PreTrainedTokenizerBase:
            return without_template

    monkeypatch.setattr(tokenizer_module, "AutoTokenizer", NoTemplateAutoTokenizer)
    tokenizer = get_tokenizer(smollm2_gguf)
    assert tokenizer is without_template
    assert tokenizer.chat_template == smollm2_tokenizer.chat_template


def test_local_folder(sp_tokenizer: PreTrainedTokenizerBase, tmp_path: os.PathLike) -> None:
    sp_tokenizer.save_pretrained(tmp_path)
    tokenizer = get_tokenizer(str(tmp_path))
    text = "Héllo wörld 😀 日本"
    assert tokenizer.encode(text) == sp_tokenizer.encode(text)


def test_unknown_model_id_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="no-such-org/no-such-model.*HF_HUB_OFFLINE"):
        get_tokenizer("no-such-org/no-such-model")
    with pytest.raises(FileNotFoundError, match="'model.gguf' of 'no-such-org/no-such-model'"):
        get_tokenizer("no-such-org/no-such-model", gguf_file="model.gguf")


def test_eos_token_ids(qwen_tokenizer: PreTrainedTokenizerBase) -> None:
    assert eos_token_ids(qwen_tokenizer) == [151645]
    assert eos_token_ids(qwen_tokenizer, {"eos_token_id": [151645, 151643]}) == [151645, 151643]
    assert eos_token_ids(qwen_tokenizer, {"eos_token_id": 151643}) == [151645, 151643]
    assert eos_token_ids(qwen_tokenizer, GenerationConfig(eos_token_id=[151643, 151645])) == [151645, 151643]
    assert eos_token_ids(qwen_tokenizer, GenerationConfig()) == [151645]
