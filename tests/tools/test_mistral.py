from __future__ import annotations

import json

import pytest
from stream_check import check_tools

from wick.tools import MistralToolParser


def listed(*calls: tuple[str, dict]) -> str:
    return "[TOOL_CALLS]" + json.dumps([{"name": n, "arguments": a} for n, a in calls], ensure_ascii=False)


def named(name: str, arguments: dict) -> str:
    return f"[TOOL_CALLS]{name}[ARGS]{json.dumps(arguments, ensure_ascii=False)}"


WEATHER = {"city": "Paris", "format": "celsius"}
NESTED = {"patch": "[TOOL_CALLS] } ] </x>", "tree": {"a": [{"b": "{"}]}}

CASES = [
    ("list, one call", listed(("get_weather", WEATHER)), None, [("get_weather", WEATHER)]),
    ("list, two calls", listed(("a", {}), ("b", {"n": 2})), None, [("a", {}), ("b", {"n": 2})]),
    ("list after a space, with ids", '[TOOL_CALLS] [{"name": "f", "arguments": {"x": 1}, "id": "a1b2c3d4e"}]', None,
     [("f", {"x": 1})]),
    ("named form", named("get_weather", WEATHER), None, [("get_weather", WEATHER)]),
    ("named form, several", named("a", {}) + named("b.c", {"q": "z"}), None, [("a", {}), ("b.c", {"q": "z"})]),
    ("text before", "Let me check.\n" + named("f", {}), "Let me check.", [("f", {})]),
    ("unicode", named("say", {"t": "¿Qué tal? 你好"}), None, [("say", {"t": "¿Qué tal? 你好"})]),
    ("nested, marker inside a string", named("apply", NESTED), None, [("apply", NESTED)]),
    ("nested in the list form", listed(("apply", NESTED)), None, [("apply", NESTED)]),
    ("broken, then valid", '[TOOL_CALLS]f[ARGS]{bad}' + named("g", {}), "[TOOL_CALLS]f[ARGS]{bad}", [("g", {})]),
]

NOT_CALLS = [
    ("plain text", "Bonjour ! Comment puis-je vous aider ?"),
    ("partial marker", "see [TOOL"),
    ("brackets in text", "Use [ARGS] or [x] as you like."),
    ("broken list JSON", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1,}}]'),
    ("missing name in the list", '[TOOL_CALLS][{"arguments": {}}]'),
    ("one bad element", '[TOOL_CALLS][{"name": "f", "arguments": {}}, {"arguments": {}}]'),
    ("empty list", "[TOOL_CALLS][]"),
    ("unclosed list", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}'),
    ("named, broken arguments", '[TOOL_CALLS]f[ARGS]{"a": }'),
    ("named, arguments not an object", "[TOOL_CALLS]f[ARGS][1, 2]"),
    ("named, no arguments", "[TOOL_CALLS]get_weather"),
    ("named, unclosed arguments", '[TOOL_CALLS]f[ARGS]{"a": "b'),
    ("marker only", "[TOOL_CALLS]"),
    ("marker then prose", "[TOOL_CALLS] I will call a tool."),
]


@pytest.mark.parametrize("text, content, calls", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_calls(text: str, content: str | None, calls: list) -> None:
    assert check_tools(MistralToolParser, text) == (content, calls)


@pytest.mark.parametrize("text", [c[1] for c in NOT_CALLS], ids=[c[0] for c in NOT_CALLS])
def test_not_calls_stay_content(text: str) -> None:
    assert check_tools(MistralToolParser, text) == (text, [])


def test_needs_special_tokens() -> None:
    assert MistralToolParser.needs_special_tokens
