"""The tool calling, reasoning and structured output of a chat request: how its output is constrained and parsed,
and the parsed parts in OpenAI's message and stream-delta shapes."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from wick.entrypoints.openai.errors import bad_request
from wick.entrypoints.openai.protocol import ChatCompletionRequest, NamedToolChoice
from wick.entrypoints.openai.structured_outputs import structured_outputs
from wick.sampling_params import StructuredOutputsParams
from wick.tools.base import ToolCall, ToolParser
from wick.tools.chat_output import ChatDelta, ChatMessageParts, ChatOutputParser
from wick.tools.reasoning import CLOSE, OPEN, ReasoningParser
from wick.tools.tool_choice import forced_call, function_schemas, within_budget


@dataclass
class ChatParsing:
    """What a chat request's output is held to and how it is read back."""

    structured_outputs: StructuredOutputsParams | None
    parser: ChatOutputParser | None  # None: the output is the content, as generated
    skip_special_tokens: bool  # False when the tool parser's markers are special tokens
    reasoning: bool  # whether messages carry reasoning_content


def chat_parsing(request: ChatCompletionRequest, tool_parser: type[ToolParser] | None,
                 reasoning_parser: type[ReasoningParser] | None, tokenizer: PreTrainedTokenizerBase,
                 prompt_token_ids: list[int], max_tokens: int | None = None) -> ChatParsing:
    """`max_tokens`: the request's budget, within which a forced call's strings are bounded (within_budget)."""
    choice = request.tool_choice.model_dump() if isinstance(request.tool_choice, NamedToolChoice) \
        else request.tool_choice
    try:
        if request.tools:
            function_schemas(request.tools)
        forced = forced_call(request.tools, choice, request.parallel_tool_calls)
        if forced is not None and max_tokens is not None:
            forced = within_budget(forced, max_tokens)
    except ValueError as e:
        raise bad_request(str(e), str(e).split(":", 1)[0]) from e
    constraint = structured_outputs(request, forced)
    reasoning = reasoning_parser
    if constraint is not None and reasoning_parser is not None:
        if forced is None:
            constraint = after_reasoning(constraint, tokenizer, prompt_token_ids)
        # A constraint that holds from the first token leaves no room for reasoning before it.
        if constraint.after_token_id is None:
            reasoning = None
    tools = tool_parser if request.tools and choice in (None, "auto") else None
    parser = ChatOutputParser(reasoning, tools, forced) if reasoning or tools or forced else None
    skip_special_tokens = request.skip_special_tokens and not (parser is not None and parser.needs_special_tokens)
    return ChatParsing(constraint, parser, skip_special_tokens, reasoning_parser is not None)


def after_reasoning(constraint: StructuredOutputsParams, tokenizer: PreTrainedTokenizerBase,
                    prompt_token_ids: list[int]) -> StructuredOutputsParams:
    """The constraint of a reasoning model's request, held back until `</think>` when the model is to think first.

    As vLLM does: it holds from the first token when the prompt has already closed the think block (Qwen3 with
    enable_thinking false), or when `</think>` is not one token of the vocabulary (no way to see it in the core).
    """
    open_id, close_id = (tokenizer.convert_tokens_to_ids(tag) for tag in (OPEN, CLOSE))
    if not isinstance(close_id, int) or tokenizer.convert_ids_to_tokens(close_id) != CLOSE:
        return constraint
    last_tag = next((t for t in reversed(prompt_token_ids) if t in (open_id, close_id)), None)
    if last_tag == close_id:
        return constraint
    return dataclasses.replace(constraint, after_token_id=close_id)


def message(parts: ChatMessageParts, reasoning: bool) -> dict[str, Any]:
    """An assistant message in OpenAI's shape."""
    result: dict[str, Any] = {"role": "assistant", "content": parts.content}
    if reasoning:
        result["reasoning_content"] = parts.reasoning
    if parts.tool_calls:
        result["tool_calls"] = [_tool_call(call) for call in parts.tool_calls]
    return result


def deltas(delta: ChatDelta) -> list[dict[str, Any]]:
    """A settled piece of a choice as stream deltas: text first, then each call as OpenAI streams one (index, id,
    type and name, then the arguments)."""
    text: dict[str, Any] = {}
    if delta.reasoning is not None:
        text["reasoning_content"] = delta.reasoning
    if delta.content is not None:
        text["content"] = delta.content
    result = [text] if text else []
    for call in delta.tool_calls:
        result.append({"tool_calls": [{"index": call.index, "id": call.id, "type": "function",
                                       "function": {"name": call.name, "arguments": ""}}]})
        result.append({"tool_calls": [{"index": call.index, "function": {"arguments": call.arguments or ""}}]})
    return result


def _tool_call(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
