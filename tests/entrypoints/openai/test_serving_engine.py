"""The bound on characters per token that lets the server refuse a prompt too long for the context
without tokenizing it: checked against the tokenizer itself."""

from __future__ import annotations

import random

from transformers import PreTrainedTokenizerBase

from wick.entrypoints.openai.serving_engine import longest_token_chars


def test_no_token_stands_for_more_characters_than_the_bound(smollm2_tokenizer: PreTrainedTokenizerBase):
    tokenizer = smollm2_tokenizer
    bound = longest_token_chars(tokenizer)
    assert max(len(tokenizer.decode([i])) for i in range(len(tokenizer))) <= bound
    rng = random.Random(0)
    texts = ["    " * 500, "\n" + " " * 2000, "=" * 3000, "ÅÄÖ 漢字 🙂 " * 200, "<|im_start|>" * 50,
             "".join(chr(rng.randrange(32, 0x3000)) for _ in range(3000))]
    for text in texts:
        assert len(text) <= len(tokenizer.encode(text, add_special_tokens=False)) * bound
