"""The chat endpoint's reasoning / content / tool-call split, streamed and whole, over a stub engine that replays a
fixed output (small real models rarely write <think> or tool calls on cue)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from wick.entrypoints.openai.chat_tools import ChatParsing
from wick.entrypoints.openai.protocol import ChatCompletionRequest
from wick.entrypoints.openai.serving_chat import ChatCall, ServingChat
from wick.entrypoints.openai.serving_models import ServingModels
from wick.outputs import CompletionOutput, RequestOutput
from wick.sampling_params import SamplingParams
from wick.tools import DeepSeekR1ReasoningParser, HermesToolParser
from wick.tools.chat_output import ChatOutputParser
from wick.tools.tool_choice import forced_call

CALL = '{"name": "get_weather", "arguments": {"location": "Paris"}}'
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


class _ReplayEngine:
    """Gives `text` one character at a time, as cumulative outputs."""

    tokenizer = None
    max_model_len = 4096

    def __init__(self, text: str, finish_reason: str = "stop") -> None:
        self.text = text
        self.finish_reason = finish_reason

    async def generate(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        for end in range(1, len(self.text) + 1):
            done = end == len(self.text)
            sample = CompletionOutput(0, self.text[:end], list(range(end)),
                                      finish_reason=self.finish_reason if done else None)
            yield RequestOutput(request_id, prompt, prompt_token_ids, [sample], finished=done)


def _serve(text: str, parser: ChatOutputParser, reasoning: bool,
           finish_reason: str = "stop") -> tuple[dict, dict]:
    """(the non-streamed message and finish reason, the streamed deltas summed up) for an output `text`."""
    chat = ServingChat(_ReplayEngine(text, finish_reason), ServingModels(["m"], "m", 4096))  # type: ignore[arg-type]
    call = ChatCall("chatcmpl-1", "prompt", [1], SamplingParams(), ChatParsing(None, parser, True, reasoning))
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], stream=True)

    async def both() -> tuple[dict, dict]:
        _, [choice] = await chat.run(call)
        outputs = chat.generate(call.request_id, call.prompt, call.prompt_token_ids, call.params)
        first = await anext(outputs)
        events = [event async for event in chat._stream(request, call, {"id": "x"}, first, outputs)]
        return {"message": choice.message, "finish_reason": choice.finish_reason}, _assemble(events)

    return asyncio.run(both())


def _assemble(events: list[str]) -> dict:
    assert events[-1] == "data: [DONE]\n\n"
    summed: dict = {"reasoning_content": "", "content": "", "tool_calls": {}, "finish_reason": None}
    for event in events[:-1]:
        [choice] = json.loads(event.removeprefix("data: "))["choices"]
        delta = choice["delta"]
        summed["finish_reason"] = summed["finish_reason"] or choice["finish_reason"]
        for key in ("reasoning_content", "content"):
            summed[key] += delta.get(key) or ""
        for call in delta.get("tool_calls", []):
            entry = summed["tool_calls"].setdefault(call["index"], {"id": "", "name": "", "arguments": ""})
            if "id" in call:
                assert call["type"] == "function" and call["function"]["arguments"] == ""
                entry["id"], entry["name"] = call["id"], call["function"]["name"]
            entry["arguments"] += call["function"]["arguments"]
    return summed


@pytest.mark.parametrize(("text", "reasoning", "content", "calls"), [
    ("I should look.</think>It is sunny.", "I should look.", "It is sunny.", []),
    ("<think>\nHmm.\n</think>\n\nSunny.", "Hmm.", "Sunny.", []),
    ("Still thinking", "Still thinking", None, []),
    (f"Weather needed.</think>\n<tool_call>\n{CALL}\n</tool_call>", "Weather needed.", None, [CALL]),
    (f"Ok.</think>Let me check.\n<tool_call>\n{CALL}\n</tool_call>", "Ok.", "Let me check.", [CALL]),
    ("Ok.</think><tool_call>\n{\"name\": broken}\n</tool_call>", "Ok.",
     "<tool_call>\n{\"name\": broken}\n</tool_call>", []),
])
def test_reasoning_then_tools_split_the_same_streamed_or_whole(text: str, reasoning: str, content: str | None,
                                                              calls: list[str]) -> None:
    whole, streamed = _serve(text, ChatOutputParser(DeepSeekR1ReasoningParser, HermesToolParser), True)
    message = whole["message"]
    assert (message["reasoning_content"], message["content"]) == (reasoning, content)
    assert (streamed["reasoning_content"], streamed["content"] or None) == (reasoning, content)
    expected = [(json.loads(c)["name"], json.loads(c)["arguments"]) for c in calls]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"]))
            for c in message.get("tool_calls", [])] == expected
    assert [(c["name"], json.loads(c["arguments"])) for c in streamed["tool_calls"].values()] == expected
    finish = "tool_calls" if calls else "stop"
    assert whole["finish_reason"] == streamed["finish_reason"] == finish


def test_forced_call_output_that_is_not_a_call_is_content() -> None:
    forced = forced_call(TOOLS, "required")
    whole, streamed = _serve('[{"name": "get_weather", "argu', ChatOutputParser(forced=forced), False)
    assert whole["message"] == {"role": "assistant", "content": '[{"name": "get_weather", "argu'}
    assert streamed["content"] == whole["message"]["content"] and not streamed["tool_calls"]
    assert whole["finish_reason"] == streamed["finish_reason"] == "stop"


def test_forced_calls_are_parsed_streamed_or_whole() -> None:
    forced = forced_call(TOOLS, "required")
    text = '[{"name": "get_weather", "arguments": {"location": "Paris"}}, ' \
           '{"name": "get_weather", "arguments": {"location": "Rome"}}]'
    whole, streamed = _serve(text, ChatOutputParser(forced=forced), False)
    locations = [json.loads(c["function"]["arguments"])["location"] for c in whole["message"]["tool_calls"]]
    assert locations == ["Paris", "Rome"] and whole["message"]["content"] is None
    assert [json.loads(c["arguments"])["location"] for c in streamed["tool_calls"].values()] == locations
    assert whole["finish_reason"] == streamed["finish_reason"] == "tool_calls"


def test_a_named_call_cut_by_max_tokens_is_a_partial_call_with_finish_reason_length() -> None:
    forced = forced_call(TOOLS, {"type": "function", "function": {"name": "get_weather"}})
    partial = '{"location": "Paris, the capital of Fr'
    whole, streamed = _serve(partial, ChatOutputParser(forced=forced), False, finish_reason="length")
    [call] = whole["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": partial} and not whole["message"]["content"]
    assert [(c["name"], c["arguments"]) for c in streamed["tool_calls"].values()] == [("get_weather", partial)]
    assert whole["finish_reason"] == streamed["finish_reason"] == "length"
