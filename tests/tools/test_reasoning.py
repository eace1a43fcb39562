from __future__ import annotations

import pytest
from stream_check import check_reasoning

from wick.tools import DeepSeekR1ReasoningParser, Qwen3ReasoningParser

THOUGHT = "Okay, the user asks for 2 + 2.\nThat is 4 (not </thin> or <think>)."

DEEPSEEK = [
    ("template opened think", f"{THOUGHT}\n</think>\n\nThe answer is 4.", THOUGHT, "The answer is 4."),
    ("model opens think itself", f"<think>\n{THOUGHT}\n</think>\n\nThe answer is 4.", THOUGHT, "The answer is 4."),
    ("never closed", f"{THOUGHT}\nStill thinking", f"{THOUGHT}\nStill thinking", None),
    ("empty reasoning", "\n</think>\n\nHi!", None, "Hi!"),
    ("nothing after", f"{THOUGHT}</think>", THOUGHT, None),
    ("answer keeps its own layout", "x</think>\n\n  - a\n  - b\n", "x", "- a\n  - b\n"),
    ("empty output", "", None, None),
]

QWEN3 = [
    ("thinking", f"<think>\n{THOUGHT}\n</think>\n\nThe answer is 4.", THOUGHT, "The answer is 4."),
    ("thinking after whitespace", f"\n<think>{THOUGHT}</think>4", THOUGHT, "4"),
    ("empty think block", "<think>\n\n</think>\n\nHello there.", None, "Hello there."),
    ("thinking disabled", "Hello there.\n\nHow can I help?", None, "Hello there.\n\nHow can I help?"),
    ("cut short while thinking", f"<think>\n{THOUGHT}", THOUGHT, None),
    ("think later in the answer", "Tags look like <think>x</think>.", None, "Tags look like <think>x</think>."),
    ("starts like a tag", "<thin ice", None, "<thin ice"),
    ("closing tag without opening", "a</think>b", None, "a</think>b"),
    ("empty output", "", None, None),
]


@pytest.mark.parametrize("text, reasoning, content", [c[1:] for c in DEEPSEEK], ids=[c[0] for c in DEEPSEEK])
def test_deepseek_r1(text: str, reasoning: str | None, content: str | None) -> None:
    assert check_reasoning(DeepSeekR1ReasoningParser, text) == (reasoning, content)


@pytest.mark.parametrize("text, reasoning, content", [c[1:] for c in QWEN3], ids=[c[0] for c in QWEN3])
def test_qwen3(text: str, reasoning: str | None, content: str | None) -> None:
    assert check_reasoning(Qwen3ReasoningParser, text) == (reasoning, content)


def test_streaming_sends_reasoning_as_it_comes() -> None:
    parser = Qwen3ReasoningParser()
    assert parser.extract_streaming("<thi") == (None, None)
    assert parser.extract_streaming("nk>\nLet me") == ("Let me", None)
    assert parser.extract_streaming(" think.\n</th") == (" think.", None)
    assert parser.extract_streaming("ink>\n\n") == (None, None)
    assert parser.extract_streaming("Four.") == (None, "Four.")
    assert parser.finish() == (None, None)
