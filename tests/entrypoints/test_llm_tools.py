"""LLM.chat with tools on the real Qwen2.5-Coder GGUF: forced tool choices give a call whose arguments validate."""

from __future__ import annotations

import json

import jsonschema
import pytest
from weather_tool import QUESTION, TOOLS, WEATHER

from wick import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm(qwen_llm: LLM) -> LLM:
    """conftest.py's Qwen2.5-Coder, LLM(qwen_gguf, max_model_len=1024), shared with test_llm.py."""
    return qwen_llm


@pytest.mark.slow
@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_chat_with_forced_tool_choice_returns_a_valid_call(llm: LLM, tool_choice: str | dict) -> None:
    [result] = llm.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=48), tools=TOOLS,
                        tool_choice=tool_choice)
    output = result.outputs[0]
    assert len(output.tool_calls) == 1 and output.text == ""
    call = output.tool_calls[0]
    assert call.name == "get_weather" and call.id.startswith("call_")
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER)
    assert "Paris" in arguments["location"]


@pytest.mark.slow
def test_chat_with_tools_keeps_content_the_parser_does_not_take_for_a_call(llm: LLM) -> None:
    [result] = llm.chat(QUESTION, SamplingParams(temperature=0.0, max_tokens=64), tools=TOOLS)
    output = result.outputs[0]
    assert output.text or output.tool_calls
    # Hermes is detected, so special tokens are kept; the end-of-sequence token still makes no text.
    assert "<|im_end|>" not in output.text
