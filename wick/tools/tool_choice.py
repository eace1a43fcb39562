"""What the server and the offline LLM share about tools: which parser a model's chat template calls for, the JSON
schema that makes `tool_choice: "required"` or a named function a guaranteed call, and turning such constrained
output back into tool calls.

A named function's output is its arguments object alone (validated against the function's `parameters`); a
required call's output is a JSON array of `{"name": ..., "arguments": {...}}` objects, each one of the tools.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from wick.tools.base import ToolCall, ToolParser, new_tool_call_id
from wick.tools.registry import detect_tool_parser, get_tool_parser

# A function's arguments when it declares no parameters.
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


@dataclass(frozen=True)
class ForcedCall:
    """A tool call the output must be: of `function`, or (None) of any of the tools."""

    function: str | None
    schema: dict[str, Any]


def resolve_tool_parser(name: str | None, tokenizer: PreTrainedTokenizerBase,
                        chat_template: str | None = None) -> type[ToolParser] | None:
    """The parser named, else the one the chat template in use implies (None: tool calls are not parsed)."""
    if name is not None:
        return get_tool_parser(name)
    model_template = tokenizer.chat_template
    if isinstance(model_template, dict):
        source = model_template.get(chat_template or "tool_use") or chat_template or model_template.get("default")
    else:
        source = chat_template or model_template
    detected = detect_tool_parser(source)
    return get_tool_parser(detected) if detected else None


def function_schemas(tools: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each function's name and its parameters schema, from OpenAI-style tools; ValueError names a bad field."""
    schemas: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or tool.get("type", "function") != "function":
            raise ValueError(f"tools.{i}: only function tools are supported")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"tools.{i}.function.name: must be a non-empty string")
        if name in schemas:
            raise ValueError(f"tools.{i}.function.name: {name!r} is defined twice")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise ValueError(f"tools.{i}.function.parameters: must be a JSON schema object")
        schemas[name] = parameters or _ANY_OBJECT
    return schemas


def forced_call(tools: list[dict[str, Any]] | None, tool_choice: str | dict[str, Any] | None,
                parallel_tool_calls: bool = True) -> ForcedCall | None:
    """The constraint `tool_choice` puts on the output; None for "auto" and "none".

    Raises ValueError (starting with the field at fault) for a tool_choice the tools cannot satisfy.
    """
    if tool_choice is None or tool_choice in ("auto", "none"):
        return None
    if not tools:
        raise ValueError("tool_choice: needs tools")
    schemas = function_schemas(tools)
    if tool_choice == "required":
        calls = [{"type": "object", "properties": {"name": {"const": name}, "arguments": parameters},
                  "required": ["name", "arguments"], "additionalProperties": False}
                 for name, parameters in schemas.items()]
        array: dict[str, Any] = {"type": "array", "minItems": 1,
                                 "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
        if not parallel_tool_calls:
            array["maxItems"] = 1
        return ForcedCall(None, array)
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise ValueError(f"tool_choice: must be 'none', 'auto', 'required' or a function, got {tool_choice!r}")
    if name not in schemas:
        raise ValueError(f"tool_choice.function.name: {name!r} is not one of the tools")
    return ForcedCall(name, schemas[name])


def within_budget(forced: ForcedCall, max_tokens: int) -> ForcedCall:
    """`forced` with a maxLength on each string its schema leaves unbounded, so that the call's object can close
    within `max_tokens` (a string of n characters takes at most n tokens of ordinary text): the room left after
    the schema's keys and punctuation (counted at two characters a token) is shared among those strings. A sampled
    model then ends its arguments instead of running a string on until max_tokens cuts the call."""
    schema = json.loads(json.dumps(forced.schema))
    open_strings: list[dict[str, Any]] = []
    keys = 0
    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(node)
            continue
        if not isinstance(node, dict):
            continue
        if node.get("type") == "string" and not {"maxLength", "enum", "const", "pattern", "format"} & node.keys():
            open_strings.append(node)
        for key in node.get("properties") or {}:
            keys += len(key) + 4  # the quoted key, its colon and a separator
        for key in ("properties", "$defs", "definitions"):
            stack.extend((node.get(key) or {}).values())
        for key in ("items", "anyOf", "oneOf", "allOf", "additionalProperties", "prefixItems"):
            if isinstance(node.get(key), dict | list):
                stack.append(node[key])
    if not open_strings:
        return forced
    room = max_tokens - keys // 2 - 4
    if room < 4 * len(open_strings):
        return forced  # too little room to bound anything usefully: max_tokens will cut the call
    for node in open_strings:
        node["maxLength"] = room // len(open_strings)
    return ForcedCall(forced.function, schema)


def parse_forced(text: str, forced: ForcedCall) -> list[ToolCall]:
    """The calls in an output made under `forced`; empty when it is not one (e.g. cut short by max_tokens)."""
    try:
        # strict=False: the grammar lets a raw control character into a string; the arguments are re-serialised
        # below, which escapes it.
        value = json.loads(text, strict=False)
    except ValueError:
        return []
    if forced.function is not None:
        if not isinstance(value, dict):
            return []
        return [ToolCall(new_tool_call_id(), forced.function, json.dumps(value, ensure_ascii=False))]
    if not isinstance(value, list) or not all(
            isinstance(item, dict) and isinstance(item.get("name"), str) and isinstance(item.get("arguments"), dict)
            for item in value):
        return []
    return [ToolCall(new_tool_call_id(), item["name"], json.dumps(item["arguments"], ensure_ascii=False))
            for item in value]
