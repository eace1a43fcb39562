"""Chat completions that use the MCP servers of --mcp-config: wick runs the model's tool calls itself.

A request that brings no `tools` of its own (and asks for one choice, with a generation prompt) is offered every MCP
tool, as OpenAI function tools with the tool's inputSchema as `parameters`, tool choice auto. Then, round by round:
the model's output is parsed; when every call in it names an MCP tool, wick calls them (at once, through the SDK),
appends the assistant's tool_calls message and one tool message per result to the conversation, and runs the model
again. After MAX_TOOL_ROUNDS such rounds the model runs once more with no tools offered, and answers with what it
has. A round without calls is the answer. A round with a call to any other name is the answer too: its calls reach
the client as ordinary tool_calls and nothing in it runs. Only the servers of the config file can ever run; nothing
in a request can name a command, a URL or a server.

The response is the final round's, built by ServingChat as for any request, plus:
- `mcp_tool_calls`: a top-level list of the calls wick ran, in order, each
  `{"id", "name", "arguments", "result"}` (arguments as the model wrote them, JSON text; result as the tool message
  the model then read, "error: ..." when the call failed);
- `usage`: summed over all rounds (every round's prompt and generated tokens).
Streaming: the tool rounds run before the stream starts, and the final round is streamed once it has finished (its
content in one delta). The first chunk carries `mcp_tool_calls`; the usage chunk, when asked for, the summed usage.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request
from starlette.responses import Response

from wick.entrypoints.openai.protocol import ChatCompletionRequest, ChatMessage, template_messages
from wick.entrypoints.openai.serving_engine import DONE, sse, unless_disconnected, usage
from wick.mcp.hub import McpHub
from wick.outputs import RequestOutput

if TYPE_CHECKING:
    from wick.entrypoints.openai.serving_chat import ChatCall, ChatChoice, ServingChat

MAX_TOOL_ROUNDS = 4


@dataclass
class _Rounds:
    """The final round (its request, model call, output and parsed choices), and what the rounds before it left."""

    request: ChatCompletionRequest
    call: ChatCall = field(init=False)
    final: RequestOutput = field(init=False)
    choices: list[ChatChoice] = field(init=False)
    mcp_tool_calls: list[dict[str, str]] = field(default_factory=list)
    num_prompt_tokens: int = 0
    num_generated_tokens: int = 0

    def usage(self) -> dict[str, int]:
        return usage(self.num_prompt_tokens, self.num_generated_tokens)


class McpChat:
    def __init__(self, hub: McpHub) -> None:
        self.hub = hub

    def offers(self, request: ChatCompletionRequest) -> bool:
        return (bool(self.hub.tools) and request.tools is None and request.tool_choice in (None, "auto")
                and request.n == 1 and request.add_generation_prompt and not request.continue_final_message)

    async def create(self, chat: ServingChat, request: ChatCompletionRequest, raw_request: Request) -> Response:
        model = chat.models.resolve(request.model)
        rounds = await unless_disconnected(raw_request, self._run(chat, request))
        if request.stream:
            header = chat.response_header(rounds.call.request_id, "chat.completion.chunk", model)
            stream = chat._stream(rounds.request, rounds.call, header, rounds.final, _nothing())
            return StreamingResponse(_annotate_stream(stream, rounds), media_type="text/event-stream")
        header = chat.response_header(rounds.call.request_id, "chat.completion", model)
        body = chat._response(rounds.request, header, rounds.final, rounds.choices)
        return JSONResponse({**body, "usage": rounds.usage(), "mcp_tool_calls": rounds.mcp_tool_calls})

    async def _run(self, chat: ServingChat, request: ChatCompletionRequest) -> _Rounds:
        request = request.model_copy(update={"tools": self.hub.openai_tools()})
        messages = request.template_messages()
        rounds = _Rounds(request)
        for number in range(MAX_TOOL_ROUNDS + 1):
            if number == MAX_TOOL_ROUNDS:
                request = request.model_copy(update={"tools": None})
            call = chat.prepare(request, messages)
            final, choices = await chat.run(call)
            rounds.request, rounds.call, rounds.final, rounds.choices = request, call, final, choices
            rounds.num_prompt_tokens += len(final.prompt_token_ids)
            rounds.num_generated_tokens += len(final.outputs[0].token_ids)
            message = choices[0].message
            calls = message.get("tool_calls") or []
            if not calls or any(call["function"]["name"] not in self.hub.tools for call in calls):
                break
            results = await asyncio.gather(*(self.hub.call(call["function"]["name"], call["function"]["arguments"])
                                             for call in calls))
            messages.extend(template_messages([ChatMessage.model_validate(message)]))
            for call, result in zip(calls, results, strict=True):
                name, arguments = call["function"]["name"], call["function"]["arguments"]
                messages.append({"role": "tool", "tool_call_id": call["id"], "name": name, "content": result})
                rounds.mcp_tool_calls.append({"id": call["id"], "name": name, "arguments": arguments,
                                              "result": result})
        return rounds


async def _nothing() -> AsyncIterator[RequestOutput]:
    return
    yield


async def _annotate_stream(stream: AsyncIterator[str], rounds: _Rounds) -> AsyncIterator[str]:
    """ServingChat's events with `mcp_tool_calls` on the first chunk and the summed usage on the usage chunk."""
    first = True
    async with aclosing(stream):
        async for event in stream:
            if event != DONE and (first or '"usage":{' in event):
                data = json.loads(event.removeprefix("data: "))
                if first and "error" not in data:
                    data["mcp_tool_calls"], first = rounds.mcp_tool_calls, False
                elif data.get("usage") is not None:
                    data["usage"] = rounds.usage()
                event = sse(data)
            yield event
