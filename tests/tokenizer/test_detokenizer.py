"""IncrementalDetokenizer: the deltas add up to exactly tokenizer.decode, with no half characters."""

from __future__ import annotations

import random

import pytest
from transformers import PreTrainedTokenizerBase

from wick.tokenizer.detokenizer import IncrementalDetokenizer

TEXTS = [
    "Hello, world! How are you today?",
    "Emoji: 😀🎉 👍🏽 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵, done.",
    "日本語のテキストです。中文文本。한국어 텍스트.",
    "Accents: héllo wörld, Ça va? naïve café, déjà vu, Straße, ñandú.",
    "def f(x):\n    return x * 2  # done\n\n\tif x:\n\t\tpass\n    \n  trailing   spaces   ",
    "  leading spaces and a lone ▁ mark, then \\u00e9 escapes ",
    "Mixed: a😀b日c\u0301d\u200be ∑∫√ ",
]
TOKENIZERS = ["smollm2_tokenizer", "qwen_tokenizer", "sp_tokenizer"]


def _chat_ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """Token ids of `text` wrapped in the tokenizer's special tokens (bos/eos, or ChatML ones)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    specials = [i for i in (tokenizer.bos_token_id, tokenizer.eos_token_id) if i is not None]
    return specials[:1] + ids + specials[-1:] + tokenizer.encode("\nok 😀 done", add_special_tokens=False)


def _groups(ids: list[int], rng: random.Random | None) -> list[list[int]]:
    """`ids` one at a time, or (with `rng`) in random-size groups."""
    if rng is None:
        return [[i] for i in ids]
    out, at = [], 0
    while at < len(ids):
        n = rng.randint(0, 5)
        out.append(ids[at:at + n])
        at += n
    return out


def _stream(tokenizer: PreTrainedTokenizerBase, ids: list[int], skip: bool,
            rng: random.Random | None) -> tuple[list[str], str]:
    full = tokenizer.decode(ids, skip_special_tokens=skip)
    detok = IncrementalDetokenizer(tokenizer, prompt_token_ids=[1, 2, 3], skip_special_tokens=skip)
    deltas = []
    for group in _groups(ids, rng):
        deltas.append(detok.add_tokens(group))
        assert full.startswith(detok.output_text)
    deltas.append(detok.flush())
    assert "".join(deltas) == detok.output_text == full
    return deltas, full


@pytest.mark.parametrize("tokenizer_name", TOKENIZERS)
@pytest.mark.parametrize("skip", [True, False])
@pytest.mark.parametrize("grouped", [False, True])
def test_texts_stream_exactly(request: pytest.FixtureRequest, tokenizer_name: str, skip: bool,
                              grouped: bool) -> None:
    tokenizer = request.getfixturevalue(tokenizer_name)
    rng = random.Random(0) if grouped else None
    for text in TEXTS:
        deltas, full = _stream(tokenizer, _chat_ids(tokenizer, text), skip, rng)
        assert "\ufffd" not in full
        assert not any("\ufffd" in d for d in deltas)
        assert deltas[-1] == ""  # nothing was left to flush


@pytest.mark.parametrize("tokenizer_name", TOKENIZERS)
def test_random_ids_stream_exactly(request: pytest.FixtureRequest, tokenizer_name: str) -> None:
    tokenizer = request.getfixturevalue(tokenizer_name)
    rng = random.Random(1234)
    vocab = len(tokenizer)
    # Pieces of real text, shuffled: many are parts of a character's bytes.
    pieces = sorted({i for text in TEXTS for i in _chat_ids(tokenizer, text)})
    for trial in range(60):
        if trial % 2:
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 80))]
        else:
            ids = [rng.choice(pieces) for _ in range(rng.randint(1, 80))]
        _stream(tokenizer, ids, skip=trial % 4 < 2, rng=rng if trial % 3 else None)


@pytest.mark.parametrize("tokenizer_name", TOKENIZERS)
def test_byte_pieces_of_one_character_are_held_back(request: pytest.FixtureRequest,
                                                    tokenizer_name: str) -> None:
    """Characters split over several tokens come out whole, in the delta of their last token."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    ids = tokenizer.encode("a😀👨‍👩‍👧日", add_special_tokens=False)
    detok = IncrementalDetokenizer(tokenizer, [])
    deltas = [detok.add_tokens([i]) for i in ids] + [detok.flush()]
    assert "".join(deltas) == tokenizer.decode(ids)
    assert all("\ufffd" not in d for d in deltas)
    assert len(deltas) > len([d for d in deltas if d])  # some tokens held back part of a character


def test_decodes_only_a_small_window(smollm2_tokenizer: PreTrainedTokenizerBase,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    ids = smollm2_tokenizer.encode(" ".join(TEXTS) * 20, add_special_tokens=False)
    assert len(ids) > 1000
    window_sizes = []
    decode = IncrementalDetokenizer._decode

    def spy(self: IncrementalDetokenizer, token_ids: list[int]) -> str:
        window_sizes.append(len(token_ids))
        return decode(self, token_ids)

    monkeypatch.setattr(IncrementalDetokenizer, "_decode", spy)
    detok = IncrementalDetokenizer(smollm2_tokenizer, [])
    for i in ids:
        detok.add_tokens([i])
    monkeypatch.undo()
    assert detok.output_text == smollm2_tokenizer.decode(ids)
    assert max(window_sizes) <= 8


def test_no_new_tokens_gives_no_text(sp_tokenizer: PreTrainedTokenizerBase) -> None:
    detok = IncrementalDetokenizer(sp_tokenizer, [])
    assert detok.add_tokens([]) == ""
    ids = sp_tokenizer.encode("héllo wörld", add_special_tokens=False)
    assert detok.add_tokens(ids) == "héllo wörld"
    assert detok.add_tokens([]) == "" and detok.flush() == ""


@pytest.mark.parametrize("tokenizer_name", TOKENIZERS)
def test_fast_tokenizers_decode_in_rust_alone(request: pytest.FixtureRequest, tokenizer_name: str) -> None:
    """Where tokenizer.decode only wraps the Rust tokenizer's decode, the detokenizer calls that directly (the
    tests above then compare it with tokenizer.decode); where it cleans up spaces too, it keeps the wrapper."""
    tokenizer = request.getfixturevalue(tokenizer_name)
    direct = IncrementalDetokenizer(tokenizer, [])._backend_decode is not None
    assert direct == (hasattr(tokenizer, "_tokenizer") and not tokenizer.clean_up_tokenization_spaces)
