from __future__ import annotations

import json

import pytest
from stream_check import check_tools

from wick.tools import Llama3JsonToolParser


def call(name: str, parameters: dict, key: str = "parameters") -> str:
    return json.dumps({"name": name, key: parameters}, ensure_ascii=False)


WEATHER = {"location": "San Francisco, CA", "unit": "fahrenheit"}
NESTED = {"query": "SELECT '}' FROM t WHERE x = '</'", "filters": [{"a": {"b": [1, "]}"]}}], "ok": True}

CASES = [
    ("single", call("get_current_weather", WEATHER), None, [("get_current_weather", WEATHER)]),
    ("arguments key", call("f", {"x": [1, 2]}, key="arguments"), None, [("f", {"x": [1, 2]})]),
    ("python tag", "<|python_tag|>" + call("f", WEATHER), None, [("f", WEATHER)]),
    ("several, semicolons", call("a", {}) + "; " + call("b", {"q": "x;y"}) + ";" + call("c", {"n": 1}), None,
     [("a", {}), ("b", {"q": "x;y"}), ("c", {"n": 1})]),
    ("leading whitespace", "\n " + call("f", {}), None, [("f", {})]),
    ("text, then python tag", "Checking now.<|python_tag|>" + call("f", {}), "Checking now.", [("f", {})]),
    ("unicode", call("say", {"text": "Grüße, 世界 🌍"}), None, [("say", {"text": "Grüße, 世界 🌍"})]),
    ("nested, braces inside strings", call("sql", NESTED), None, [("sql", NESTED)]),
    ("trailing semicolon and space", call("f", {}) + ";\n", None, [("f", {})]),
    ("a valid call, then a broken one", call("a", {}) + '; {"name": ', '{"name": ', [("a", {})]),
    ("a valid call, then text", call("a", {}) + ";\nAll done.", "All done.", [("a", {})]),
]

NOT_CALLS = [
    ("plain text", "Hello! How can I help you today?"),
    ("brace later in text", "Sure: {not a call}"),
    ("broken JSON", '{"name": "f", "parameters": {"a": }}'),
    ("missing name", '{"parameters": {"a": 1}}'),
    ("plain JSON answer", '{"answer": 42}'),
    ("unclosed object", '{"name": "f", "parameters": {"a": 1}'),
    ("text after the object", call("f", {}) + " is what I would call."),
    ("built-in tool call", '<|python_tag|>brave_search.call(query="weather in SF")'),
    ("only the tag", "<|python_tag|>"),
    ("partial tag", "see <|python"),
]


@pytest.mark.parametrize("text, content, calls", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_calls(text: str, content: str | None, calls: list) -> None:
    assert check_tools(Llama3JsonToolParser, text) == (content, calls)


@pytest.mark.parametrize("text", [c[1] for c in NOT_CALLS], ids=[c[0] for c in NOT_CALLS])
def test_not_calls_stay_content(text: str) -> None:
    assert check_tools(Llama3JsonToolParser, text) == (text, [])


def test_text_then_bare_json_is_content() -> None:
    text = "Here you go: " + call("f", {})
    assert check_tools(Llama3JsonToolParser, text) == (text, [])
