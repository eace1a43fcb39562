from __future__ import annotations

import json

import pytest
from stream_check import check_tools, stream_tools

from wick.tools import HermesToolParser


def call(name: str, arguments: dict) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}\n</tool_call>"


WEATHER = {"city": "Paris", "unit": "celsius"}
UNICODE = "Zürich — 日本語 😀"
NESTED = {"code": "if (a) { return '}'; }", "html": "<b>x</b></tool_call>", "rows": [1, {"b": "}]"}], "n": None}

CASES = [
    ("single", call("get_weather", WEATHER), None, [("get_weather", WEATHER)]),
    ("several after text", "Let me look both up.\n\n" + call("get_weather", WEATHER) + "\n" + call("get_time", {}),
     "Let me look both up.", [("get_weather", WEATHER), ("get_time", {})]),
    ("unicode", call("translate", {"text": UNICODE}), None, [("translate", {"text": UNICODE})]),
    ("escaped unicode", '<tool_call>\n{"name": "f", "arguments": {"s": "\\u00fc\\n\\"q\\""}}\n</tool_call>', None,
     [("f", {"s": 'ü\n"q"'})]),
    ("nested, closing tag inside a string", call("run", NESTED), None, [("run", NESTED)]),
    ("compact, no newlines", '<tool_call>{"name":"f","arguments":{"a":[1,2.5,true]}}</tool_call>', None,
     [("f", {"a": [1, 2.5, True]})]),
    ("arguments as a JSON string", '<tool_call>\n{"name": "f", "arguments": "{\\"a\\": 1}"}\n</tool_call>', None,
     [("f", {"a": 1})]),
    ("no arguments", '<tool_call>\n{"name": "now"}\n</tool_call>', None, [("now", {})]),
    ("text after the calls", call("f", {}) + "\nDone, calling it.", "Done, calling it.", [("f", {})]),
    ("whitespace only around", "\n\n" + call("f", {}) + "\n\n", None, [("f", {})]),
    ("unclosed but complete at the end", '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n', None,
     [("f", {"a": 1})]),
    ("bare object, no tags", '{"name": "f", "arguments": {"a": 1}}', None, [("f", {"a": 1})]),
    ("bare object in a json fence", '```json\n{"name": "f", "arguments": {"a": 1}}\n```\n', None,
     [("f", {"a": 1})]),
    ("bare object in an unclosed plain fence", '\n```\n{"name": "f", "parameters": {}}\n', None, [("f", {})]),
]

NOT_CALLS = [
    ("plain text", "The answer is 42. Use <b>bold</b>, and a < b holds."),
    ("plain text ending in a partial tag", "I could use a <tool"),
    ("broken JSON", '<tool_call>\n{"name": "f", "arguments": {"a": 1,}}\n</tool_call>'),
    ("missing name", '<tool_call>\n{"arguments": {"a": 1}}\n</tool_call>'),
    ("name not a string", '<tool_call>\n{"name": 3, "arguments": {}}\n</tool_call>'),
    ("arguments not an object", '<tool_call>\n{"name": "f", "arguments": [1]}\n</tool_call>'),
    ("not an object", "<tool_call>\nget_weather(city='Paris')\n</tool_call>"),
    ("unclosed, cut short", 'Sure.\n<tool_call>\n{"name": "f", "arguments": {"a": '),
    ("unclosed string", '<tool_call>\n{"name": "f</tool_call> and more'),
    ("text after the object", '<tool_call>\n{"name": "f", "arguments": {}} oops\n</tool_call>'),
    ("cut inside the closing tag", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_'),
    ("opening tag twice", '<tool_call><tool_call>{"name": "f"}</tool_call>'),
    ("only an opening tag", "<tool_call>"),
    ("a JSON answer", '{"name": "Bob", "age": 3}'),
    ("a JSON answer with other keys", '{"name": "f", "arguments": {}, "note": 1}'),
    ("bare call then text", '{"name": "f", "arguments": {}}\nand more'),
    ("bare call after text", 'Here: {"name": "f", "arguments": {}}'),
    ("bare call, cut short", '{"name": "f", "arguments": {"a": '),
    ("a code fence", "```python\nprint({'a': 1})\n```"),
    ("a json fence around a non-call", '```json\n{"a": 1}\n```'),
    ("a fence alone", "```"),
    ("a partial fence", "``"),
]


@pytest.mark.parametrize("text, content, calls", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_calls(text: str, content: str | None, calls: list) -> None:
    assert check_tools(HermesToolParser, text) == (content, calls)


@pytest.mark.parametrize("text", [c[1] for c in NOT_CALLS], ids=[c[0] for c in NOT_CALLS])
def test_not_calls_stay_content(text: str) -> None:
    assert check_tools(HermesToolParser, text) == (text, [])


def test_broken_call_between_valid_ones() -> None:
    text = "Trying.\n<tool_call>{bad json}</tool_call>\n" + call("g", {"x": "y"}) + " " + call("h", {})
    assert check_tools(HermesToolParser, text) == ("Trying.\n<tool_call>{bad json}</tool_call>",
                                                  [("g", {"x": "y"}), ("h", {})])


def test_arguments_are_reserialized_without_ascii_escapes() -> None:
    result = HermesToolParser().extract('<tool_call>{"name":"f","arguments":{"a":"\\u00e9","b" :1}}</tool_call>')
    assert result.tool_calls[0].arguments == '{"a": "é", "b": 1}'


def test_empty_output() -> None:
    assert HermesToolParser().extract("").content is None
    assert HermesToolParser().finish() is None


def test_streaming_holds_back_a_possible_tag() -> None:
    parser = HermesToolParser()
    first = parser.extract_streaming("Hello <tool")
    assert first is not None and first.content == "Hello"
    assert parser.extract_streaming("_c") is None
    flushed = parser.finish()
    assert flushed is not None and flushed.content == " <tool_c" and flushed.tool_calls == []


def test_streaming_sends_a_call_once_it_closes() -> None:
    parser = HermesToolParser()
    pieces = ["Checking.\n", "<tool_call>\n", '{"name": "f", ', '"arguments": {"a": 1}}', "\n</tool_call>", "\n"]
    deltas = [parser.extract_streaming(piece) for piece in pieces]
    assert deltas[0] is not None and deltas[0].content == "Checking."
    assert deltas[1:4] == [None, None, None]
    assert deltas[4] is not None and deltas[4].content is None
    assert [(d.index, d.name, d.arguments) for d in deltas[4].tool_calls] == [(0, "f", '{"a": 1}')]
    assert deltas[5] is None and parser.finish() is None


def test_plain_text_is_sent_as_it_comes() -> None:
    parser = HermesToolParser()
    words = [f"word{i} " for i in range(200)]
    deltas = [parser.extract_streaming(word) for word in words]
    assert all(delta is not None and delta.content for delta in deltas)
    assert stream_tools(HermesToolParser, words) == ("".join(words), [])


def test_long_call_streamed_in_small_pieces() -> None:
    code = "".join(f"def f{i}(x):\n    return {{'k': [x, \"{i}\\\\\"]}}\n" for i in range(1000))
    arguments = {"path": "a.py", "content": code, "rows": [{"k": i, "v": "}]"} for i in range(100)]}
    text = call("write_file", arguments)
    pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
    content, calls = stream_tools(HermesToolParser, pieces)
    assert content is None and [(name, json.loads(args)) for name, args in calls] == [("write_file", arguments)]
