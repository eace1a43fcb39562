"""When a reasoning model's constrained output starts: after `</think>` if the model is to think first, at once if
the prompt closed the think block or the vocabulary has no `</think>` token."""

from __future__ import annotations

import copy

import pytest
from transformers import PreTrainedTokenizerBase

from wick.entrypoints.openai.chat_tools import after_reasoning, chat_parsing
from wick.entrypoints.openai.protocol import ChatCompletionRequest
from wick.sampling_params import StructuredOutputsParams
from wick.tools import DeepSeekR1ReasoningParser

SCHEMA = StructuredOutputsParams(json={"type": "object"})


@pytest.fixture(scope="module")
def plain(smollm2_tokenizer: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    return smollm2_tokenizer


@pytest.fixture(scope="module")
def thinking(plain: PreTrainedTokenizerBase) -> PreTrainedTokenizerBase:
    """The same vocabulary with <think> and </think> as tokens, as reasoning models have them."""
    tokenizer = copy.deepcopy(plain)
    tokenizer.add_tokens(["<think>", "</think>"])
    return tokenizer


def _ids(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("prompt, waits", [
    ("<|im_start|>assistant\n<think>\n", True),
    ("<|im_start|>assistant\n", True),
    ("<|im_start|>assistant\n<think>\n\n</think>\n\n", False),
    ("<think>old</think> then <think>\n", True),
])
def test_the_grammar_waits_for_the_end_of_thinking(thinking: PreTrainedTokenizerBase, prompt: str,
                                                   waits: bool) -> None:
    close = thinking.convert_tokens_to_ids("</think>")
    held = after_reasoning(SCHEMA, thinking, _ids(thinking, prompt))
    assert held.after_token_id == (close if waits else None)
    assert held.json == SCHEMA.json


def test_without_a_think_token_the_grammar_holds_at_once(plain: PreTrainedTokenizerBase) -> None:
    assert after_reasoning(SCHEMA, plain, _ids(plain, "<|im_start|>assistant\n<think>\n")).after_token_id is None


def test_reasoning_is_parsed_only_when_the_grammar_waits(thinking: PreTrainedTokenizerBase,
                                                         plain: PreTrainedTokenizerBase) -> None:
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}],
                                    response_format={"type": "json_object"})
    waiting = chat_parsing(request, None, DeepSeekR1ReasoningParser, thinking, _ids(thinking, "<think>\n"))
    assert waiting.structured_outputs.after_token_id is not None
    assert waiting.parser.extract("<think>hmm</think>{}").reasoning == "hmm"
    at_once = chat_parsing(request, None, DeepSeekR1ReasoningParser, plain, _ids(plain, "<think>\n"))
    assert at_once.structured_outputs.after_token_id is None and at_once.parser is None
