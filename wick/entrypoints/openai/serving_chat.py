"""POST /v1/chat/completions, in OpenAI's shapes: one JSON response, or Server-Sent Events chunks."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request
from starlette.responses import Response

from wick.engine.async_engine import AsyncEngine
from wick.entrypoints.openai.chat_tools import ChatParsing, chat_parsing, deltas, message
from wick.entrypoints.openai.errors import OpenAIError, stopped_by_shutdown
from wick.entrypoints.openai.protocol import ChatCompletionRequest
from wick.entrypoints.openai.serving_engine import (
    DONE,
    ChoiceCursor,
    OpenAIServing,
    finite,
    random_id,
    sse,
    unless_disconnected,
    usage,
)
from wick.entrypoints.openai.serving_models import ServingModels
from wick.outputs import CompletionOutput, PositionLogprobs, RequestOutput
from wick.sampling_params import SamplingParams
from wick.tools.base import ToolParser
from wick.tools.chat_output import ChatMessageParts, ChatOutputParser
from wick.tools.reasoning import ReasoningParser

logger = logging.getLogger(__name__)

if TYPE_CHECKING:
    from wick.entrypoints.openai.serving_mcp import McpChat


@dataclass
class ChatCall:
    """One model call of a chat request, ready to run."""

    request_id: str
    prompt: str
    prompt_token_ids: list[int]
    params: SamplingParams
    parsing: ChatParsing


@dataclass
class ChatChoice:
    """One choice of a finished call: the assistant message in OpenAI's shape and why it ended."""

    output: CompletionOutput
    message: dict[str, Any]
    finish_reason: str | None


class ServingChat(OpenAIServing):
    def __init__(self, engine: AsyncEngine, models: ServingModels, chat_template: str | None = None,
                 tool_parser: type[ToolParser] | None = None,
                 reasoning_parser: type[ReasoningParser] | None = None) -> None:
        super().__init__(engine, models, chat_template)
        self.tool_parser = tool_parser
        self.reasoning_parser = reasoning_parser
        # MCP tools (--mcp-config): set by build_app; the requests it takes run their tool rounds in serving_mcp.py.
        self.mcp: McpChat | None = None
        self._template_renders_tools: bool | None = None

    async def create(self, request: ChatCompletionRequest, raw_request: Request) -> Response:
        if self.mcp is not None and self.mcp.offers(request):
            return await self.mcp.create(self, request, raw_request)
        model = self.models.resolve(request.model)
        call = self.prepare(request, request.template_messages())
        if request.stream:
            outputs = self.generate(call.request_id, call.prompt, call.prompt_token_ids, call.params)
            # The first output comes before the response starts, so that a refused request gets its status.
            first = await unless_disconnected(raw_request, anext(outputs, None))
            if first is None:
                raise stopped_by_shutdown()
            header = self.response_header(call.request_id, "chat.completion.chunk", model)
            return StreamingResponse(self._stream(request, call, header, first, outputs),
                                     media_type="text/event-stream")
        final, choices = await unless_disconnected(raw_request, self.run(call))
        header = self.response_header(call.request_id, "chat.completion", model)
        return JSONResponse(self._response(request, header, final, choices))

    def prepare(self, request: ChatCompletionRequest, messages: list[dict[str, Any]]) -> ChatCall:
        """The model call for `messages` (as chat templates read them) under the request's settings."""
        prompt, prompt_token_ids = self.render_chat(
            messages, request.tools, request.add_generation_prompt, request.continue_final_message,
            request.chat_template_kwargs)
        max_tokens = self.max_tokens(request, len(prompt_token_ids), "messages")
        if request.tools and request.tool_choice in (None, "auto"):
            self._check_template_renders_tools()
        parsing = chat_parsing(request, self.tool_parser, self.reasoning_parser, self.tokenizer, prompt_token_ids,
                               max_tokens)
        params = self.sampling_params(lambda: request.sampling_params(
            max_tokens, request.num_logprobs, structured_outputs=parsing.structured_outputs,
            defaults=self.engine.sampling_defaults).clone(
            skip_special_tokens=parsing.skip_special_tokens))
        return ChatCall(random_id("chatcmpl"), prompt, prompt_token_ids, params, parsing)

    def _check_template_renders_tools(self) -> None:
        """Warns once when the chat template leaves `tools` out of the prompt (SmolLM2's does): with tool_choice
        "auto" the model is then offered no tools and answers in content."""
        if self._template_renders_tools is None:
            probe = "wick_probe_tool"
            tools = [{"type": "function", "function": {"name": probe, "parameters": {"type": "object"}}}]
            text, _ = self.render_chat([{"role": "user", "content": "hi"}], tools, True, False, None)
            self._template_renders_tools = probe in text
            if not self._template_renders_tools:
                logger.warning("the chat template does not show `tools` to the model: requests with tool_choice "
                               "'auto' get answers without tool calls (give --chat-template one that renders "
                               "tools, or use tool_choice 'required' or a named function, which are enforced)")

    async def run(self, call: ChatCall) -> tuple[RequestOutput, list[ChatChoice]]:
        """Runs one model call to its end; returns its output and each choice's parsed assistant message."""
        final = await _last(self.generate(call.request_id, call.prompt, call.prompt_token_ids, call.params))
        choices = []
        for output in final.outputs:
            if call.parsing.parser is None:
                parts = ChatMessageParts(None, output.text, [])
            else:
                parts = call.parsing.parser.extract(output.text)
            finish_reason = _finish_reason(output.finish_reason, bool(parts.tool_calls))
            choices.append(ChatChoice(output, message(parts, call.parsing.reasoning), finish_reason))
        return final, choices

    def _response(self, request: ChatCompletionRequest, header: dict[str, Any], final: RequestOutput,
                  choices: list[ChatChoice]) -> dict[str, Any]:
        body = [{
            "index": choice.output.index,
            "message": choice.message,
            "logprobs": self._logprobs(request, choice.output, range(len(choice.output.token_ids))),
            "finish_reason": choice.finish_reason,
            "stop_reason": choice.output.stop_reason,
        } for choice in choices]
        num_generated = sum(len(o.token_ids) for o in final.outputs)
        return {**header, "choices": body, "usage": usage(len(final.prompt_token_ids), num_generated)}

    async def _stream(self, request: ChatCompletionRequest, call: ChatCall, header: dict[str, Any],
                      first: RequestOutput, outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[str]:
        choices = [_StreamChoice(call.parsing.parser) for _ in range(request.n)]
        try:
            for index in range(request.n):
                yield sse({**header, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                                  "logprobs": None, "finish_reason": None}]})
            output: RequestOutput | None = first
            while output is not None:
                for sample in output.outputs:
                    for chunk in self._chunks(request, header, sample, choices[sample.index]):
                        yield chunk
                last, output = output, await anext(outputs, None)
            for index, choice in enumerate(choices):
                if not choice.cursor.finished:  # stopped by the server's shutdown
                    yield sse({**header, "choices": [{"index": index, "delta": {}, "logprobs": None,
                                                      "finish_reason": "abort"}]})
            if request.include_usage:
                num_generated = sum(len(o.token_ids) for o in last.outputs)
                yield sse({**header, "choices": [], "usage": usage(len(last.prompt_token_ids), num_generated)})
        except OpenAIError as e:
            yield sse(e.body())
        finally:
            await outputs.aclose()
        yield DONE

    def _chunks(self, request: ChatCompletionRequest, header: dict[str, Any], sample: CompletionOutput,
                choice: _StreamChoice) -> list[str]:
        cursor = choice.cursor
        if cursor.finished:
            return []
        updates = choice.deltas(cursor.new_text(sample), sample.finished)
        logprobs = self._logprobs(request, sample, cursor.new_tokens(sample))
        if not updates and logprobs and logprobs["content"]:
            updates = [{}]
        chunks = [sse({**header, "choices": [{"index": sample.index, "delta": delta,
                                              "logprobs": logprobs if i == 0 else None, "finish_reason": None}]})
                  for i, delta in enumerate(updates)]
        if sample.finished:
            cursor.finished = True
            finish_reason = _finish_reason(sample.finish_reason, bool(choice.num_tool_calls))
            chunks.append(sse({**header, "choices": [{"index": sample.index, "delta": {}, "logprobs": None,
                                                      "finish_reason": finish_reason,
                                                      "stop_reason": sample.stop_reason}]}))
        return chunks

    def _logprobs(self, request: ChatCompletionRequest, sample: CompletionOutput,
                  positions: range) -> dict[str, Any] | None:
        if request.num_logprobs is None or sample.logprobs is None:
            return None
        return {"content": [self._token_logprob(sample.token_ids[i], sample.logprobs[i], request.num_logprobs)
                            for i in positions if i < len(sample.logprobs)]}

    def _token_logprob(self, token_id: int, position: PositionLogprobs, num_top: int) -> dict[str, Any]:
        def entry(tid: int) -> dict[str, Any]:
            logprob = position[tid]
            token = logprob.decoded_token if logprob.decoded_token is not None else self.tokenizer.decode([tid])
            return {"token": token, "logprob": finite(logprob.logprob), "bytes": list(token.encode())}

        ranked = sorted(position, key=lambda tid: position[tid].rank or 0)
        top = [entry(tid) for tid in ranked[:num_top]]
        if token_id not in position:
            return {"token": self.tokenizer.decode([token_id]), "logprob": -9999.0, "bytes": None,
                    "top_logprobs": top}
        return {**entry(token_id), "top_logprobs": top}


class _StreamChoice:
    """A streamed choice: how much was sent, and its own parser (parsers keep state)."""

    def __init__(self, parser: ChatOutputParser | None) -> None:
        self.cursor = ChoiceCursor()
        self.parser = parser.fresh() if parser is not None else None
        self.num_tool_calls = 0

    def deltas(self, text: str, finished: bool) -> list[dict[str, Any]]:
        if self.parser is None:
            return [{"content": text}] if text else []
        pieces = [self.parser.feed(text) if text else None, self.parser.finish() if finished else None]
        result = []
        for piece in pieces:
            if piece is not None:
                self.num_tool_calls += len(piece.tool_calls)
                result.extend(deltas(piece))
        return result


def _finish_reason(reason: str | None, has_tool_calls: bool) -> str | None:
    """"tool_calls" when the output made calls, but "length" when max_tokens cut it (the last call may be partial),
    as OpenAI reports it."""
    return "tool_calls" if has_tool_calls and reason != "length" else reason


async def _last(outputs: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = None
    async with aclosing(outputs):
        async for output in outputs:
            final = output
    if final is None or not final.finished:
        raise stopped_by_shutdown()
    return final
