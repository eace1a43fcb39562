"""Parsers by name, and the tool-call format a chat template implies."""

from __future__ import annotations

from wick.tools.base import ToolParser
from wick.tools.hermes import HermesToolParser
from wick.tools.llama3_json import Llama3JsonToolParser
from wick.tools.mistral import MistralToolParser
from wick.tools.reasoning import DeepSeekR1ReasoningParser, Qwen3ReasoningParser, ReasoningParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "qwen": HermesToolParser,
    "llama3_json": Llama3JsonToolParser,
    "mistral": MistralToolParser,
}

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {
    "deepseek_r1": DeepSeekR1ReasoningParser,
    "qwen3": Qwen3ReasoningParser,
}


def get_tool_parser(name: str) -> type[ToolParser]:
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool parser {name!r}; choose one of {', '.join(TOOL_PARSERS)}") from None


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}") from None


def detect_tool_parser(chat_template: str | None) -> str | None:
    """The tool parser a chat template's tool-call convention calls for, or None if it shows none."""
    if not chat_template:
        return None
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<tool_call>" in chat_template:
        return "hermes"
    if "<|python_tag|>" in chat_template or ("<|start_header_id|>" in chat_template and "ipython" in chat_template):
        return "llama3_json"
    return None
