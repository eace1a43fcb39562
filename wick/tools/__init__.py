"""Tool-call and reasoning parsers for chat outputs."""

from wick.tools.base import DeltaMessage, ExtractedToolCalls, ToolCall, ToolCallDelta, ToolParser
from wick.tools.hermes import HermesToolParser
from wick.tools.llama3_json import Llama3JsonToolParser
from wick.tools.mistral import MistralToolParser
from wick.tools.reasoning import DeepSeekR1ReasoningParser, Qwen3ReasoningParser, ReasoningParser
from wick.tools.registry import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    detect_tool_parser,
    get_reasoning_parser,
    get_tool_parser,
)

__all__ = [
    "REASONING_PARSERS",
    "TOOL_PARSERS",
    "DeepSeekR1ReasoningParser",
    "DeltaMessage",
    "ExtractedToolCalls",
    "HermesToolParser",
    "Llama3JsonToolParser",
    "MistralToolParser",
    "Qwen3ReasoningParser",
    "ReasoningParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "detect_tool_parser",
    "get_reasoning_parser",
    "get_tool_parser",
]
