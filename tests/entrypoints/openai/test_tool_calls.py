"""Tool calling through a real `wick serve` of Qwen2.5-Coder-0.5B-Instruct (its template takes tools; hermes is
detected): forced tool choices give calls whose arguments validate, streamed or not, and a tool result gets an
answer. The server is conftest.py's `mcp_server`, shared with test_serving_mcp.py: these requests bring their own
tools, so its MCP servers take no part in them."""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest
from weather_tool import QUESTION, TOOLS, WEATHER
from wick_server import API_KEY, ServerProcess

NAMED = {"type": "function", "function": {"name": "get_weather"}}
SETTINGS = {"model": "", "messages": QUESTION, "tools": TOOLS, "temperature": 0.0, "max_tokens": 48}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def qwen(mcp_server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{mcp_server.url}/v1", api_key=API_KEY, max_retries=0, timeout=300)


def _check_weather_call(name: str, arguments: str) -> None:
    assert name == "get_weather"
    parsed = json.loads(arguments)
    jsonschema.validate(parsed, WEATHER)
    assert "Paris" in parsed["location"]


@pytest.mark.parametrize("tool_choice", ["required", NAMED])
def test_forced_tool_choice_returns_a_call_that_validates(qwen: openai.OpenAI, tool_choice: str | dict) -> None:
    response = qwen.chat.completions.create(tool_choice=tool_choice, **SETTINGS)
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert not choice.message.content
    [call] = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    _check_weather_call(call.function.name, call.function.arguments)


def test_streamed_call_assembles_to_the_same_call(qwen: openai.OpenAI) -> None:
    whole = qwen.chat.completions.create(tool_choice="required", **SETTINGS).choices[0].message.tool_calls[0]
    chunks = list(qwen.chat.completions.create(tool_choice="required", stream=True, **SETTINGS))
    calls: dict[int, dict[str, str]] = {}
    for chunk in chunks:
        deltas = (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []
        for delta in deltas:
            call = calls.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            if delta.id:
                assert not call["id"] and delta.type == "function" and delta.function.name
                call["id"], call["name"] = delta.id, delta.function.name
            call["arguments"] += delta.function.arguments or ""
    assert list(calls) == [0] and calls[0]["id"].startswith("call_")
    assert (calls[0]["name"], json.loads(calls[0]["arguments"])) == (whole.function.name,
                                                                     json.loads(whole.function.arguments))
    _check_weather_call(calls[0]["name"], calls[0]["arguments"])
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["tool_calls"]


def test_tool_result_gets_a_plain_answer(qwen: openai.OpenAI) -> None:
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"location": "Paris", "unit": "celsius"})}}
    messages = [*QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"temperature": 21, "sky": "sunny"})}]
    response = qwen.chat.completions.create(**{**SETTINGS, "messages": messages, "max_tokens": 32})
    choice = response.choices[0]
    assert choice.finish_reason in ("stop", "length") and not choice.message.tool_calls
    assert "21" in choice.message.content
