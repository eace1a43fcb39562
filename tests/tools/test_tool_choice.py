from __future__ import annotations

import json
from types import SimpleNamespace

import jsonschema
import pytest

from wick.sampling_params import SamplingParams, StructuredOutputsParams
from wick.tools import HermesToolParser, MistralToolParser
from wick.tools.chat_output import ChatOutputParser, tool_call_params
from wick.tools.tool_choice import forced_call, parse_forced, resolve_tool_parser, within_budget

WEATHER = {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time"}}]


def test_required_schema_accepts_calls_of_the_tools_only() -> None:
    schema = forced_call(TOOLS, "required").schema
    jsonschema.validate([{"name": "get_weather", "arguments": {"location": "Paris"}},
                         {"name": "get_time", "arguments": {}}], schema)
    for bad in ([], [{"name": "get_weather", "arguments": {}}], [{"name": "other", "arguments": {}}],
                [{"name": "get_time"}]):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)
    single = forced_call(TOOLS, "required", parallel_tool_calls=False).schema
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate([{"name": "get_time", "arguments": {}}] * 2, single)


def test_named_function_schema_is_its_parameters() -> None:
    forced = forced_call(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    assert (forced.function, forced.schema) == ("get_weather", WEATHER)
    assert forced_call(TOOLS, {"type": "function", "function": {"name": "get_time"}}).schema == {"type": "object"}
    assert forced_call(TOOLS, "auto") is None and forced_call(TOOLS, "none") is None


@pytest.mark.parametrize(("tools", "choice", "field"), [
    (None, "required", "tool_choice"),
    (TOOLS, {"type": "function", "function": {"name": "nope"}}, "tool_choice.function.name"),
    (TOOLS, "sometimes", "tool_choice"),
    ([*TOOLS, TOOLS[0]], "required", "tools.2.function.name"),
    ([{"type": "retrieval"}], "required", "tools.0"),
    ([{"function": {"name": "f", "parameters": []}}], "required", "tools.0.function.parameters"),
])
def test_unsatisfiable_tool_choices_name_the_field(tools: list | None, choice: str | dict, field: str) -> None:
    with pytest.raises(ValueError, match=f"^{field}:"):
        forced_call(tools, choice)


def test_parse_forced_turns_constrained_output_into_calls() -> None:
    named = forced_call(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    [call] = parse_forced('{"location": "Paris"}', named)
    assert call.name == "get_weather" and json.loads(call.arguments) == {"location": "Paris"}
    required = forced_call(TOOLS, "required")
    calls = parse_forced('[{"name": "get_time", "arguments": {}}, {"name": "get_weather", "arguments": '
                         '{"location": "Rome"}}]', required)
    assert [c.name for c in calls] == ["get_time", "get_weather"] and len({c.id for c in calls}) == 2
    for text in ('{"location": "Par', "[]", '[{"name": "get_time"}]', "null"):
        assert parse_forced(text, required) == []
    assert parse_forced("[1]", named) == []


def test_tool_parser_is_named_or_detected_from_the_template() -> None:
    hermes_template = "{{ '<tool_call>' }}"
    assert resolve_tool_parser("mistral", SimpleNamespace(chat_template=None)) is MistralToolParser
    assert resolve_tool_parser(None, SimpleNamespace(chat_template=hermes_template)) is HermesToolParser
    assert resolve_tool_parser(None, SimpleNamespace(chat_template="plain")) is None
    assert resolve_tool_parser(None, SimpleNamespace(chat_template="plain"), hermes_template) is HermesToolParser
    named = SimpleNamespace(chat_template={"default": "plain", "tool_use": hermes_template})
    assert resolve_tool_parser(None, named) is HermesToolParser
    assert resolve_tool_parser(None, named, "default") is None
    with pytest.raises(ValueError, match="unknown tool parser"):
        resolve_tool_parser("nope", SimpleNamespace(chat_template=None))


def test_tool_call_params_constrain_and_keep_special_tokens() -> None:
    forced = forced_call(TOOLS, "required")
    params = tool_call_params(SamplingParams(max_tokens=8), ChatOutputParser(forced=forced), forced)
    assert params.structured_outputs == StructuredOutputsParams(json=forced.schema) and params.skip_special_tokens
    auto = tool_call_params(SamplingParams(), ChatOutputParser(tools=HermesToolParser), None)
    assert auto.structured_outputs is None and not auto.skip_special_tokens
    with pytest.raises(ValueError, match="structured output"):
        tool_call_params(SamplingParams(structured_outputs=StructuredOutputsParams(regex="a")),
                         ChatOutputParser(forced=forced), forced)


def test_within_budget_bounds_open_strings_so_the_call_can_close() -> None:
    import xgrammar as xgr

    weather = {"type": "object", "properties": {"location": {"type": "string"},
                                                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                                "notes": {"type": "array", "items": {"type": "string"}}},
               "required": ["location"]}
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": weather}}]
    forced = forced_call(tools, {"type": "function", "function": {"name": "get_weather"}})
    bounded = within_budget(forced, 120)
    location, notes = bounded.schema["properties"]["location"], bounded.schema["properties"]["notes"]["items"]
    assert location["maxLength"] == notes["maxLength"] and 8 <= location["maxLength"] < 60
    assert "maxLength" not in bounded.schema["properties"]["unit"]
    assert "maxLength" not in weather["properties"]["location"]  # the tool's own schema is not changed
    assert within_budget(forced, 12).schema == forced.schema  # too little room: left as it was

    # As the engine compiles it (wick/core/structured_output.py).
    compiler = xgr.GrammarCompiler(xgr.TokenizerInfo([]))
    matcher = xgr.GrammarMatcher(compiler.compile_json_schema(json.dumps(bounded.schema), any_whitespace=False))
    longest = "x" * location["maxLength"]
    assert matcher.accept_string(json.dumps({"location": longest}))
    matcher.reset()
    assert not matcher.accept_string(json.dumps({"location": longest + "x"}))


def test_a_raw_control_character_in_a_forced_call_is_escaped() -> None:
    forced = forced_call([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
                         {"type": "function", "function": {"name": "f"}})
    [call] = parse_forced('{"location": "Paris\x08"}', forced)
    assert json.loads(call.arguments) == {"location": "Paris\b"}
