"""Tokenizers for the tokenizer tests: the two real GGUF ones (smollm2_tokenizer and qwen_tokenizer, in
tests/conftest.py) and a tiny SentencePiece one trained here."""

from __future__ import annotations

import io

import pytest
from transformers import LlamaTokenizer, PreTrainedTokenizerBase

SP_TRAINING_TEXT = [
    "Hello world, héllo wörld! Ça va? naïve café, déjà vu, Straße.",
    "日本語のテキストです。中文文本。한국어 텍스트.",
    "def f(x):\n    return x * 2  # done\n\tif x:\n\t\tpass",
    "The quick brown fox jumps over the lazy dog. 😀 🎉 👍🏽",
]


@pytest.fixture(scope="session")
def sp_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> PreTrainedTokenizerBase:
    """A Llama-2 style SentencePiece BPE ("▁" for spaces, byte fallback for rare characters)."""
    import sentencepiece as spm

    model = io.BytesIO()
    # character_coverage < 1 leaves the rarest characters (emoji, some CJK) to byte fallback.
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(SP_TRAINING_TEXT * 20), model_writer=model, vocab_size=400,
        model_type="bpe", byte_fallback=True, character_coverage=0.98, minloglevel=2,
        unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    folder = tmp_path_factory.mktemp("sp")
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    return LlamaTokenizer.from_pretrained(str(folder))
