"""What the endpoints share: chat template rendering, the max_tokens rule, SamplingParams errors as
400s, running one request on the engine with its errors mapped to HTTP statuses, the request aborted
when the client goes away, and the pieces of OpenAI's response shapes."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from starlette.requests import Request
from transformers import PreTrainedTokenizerBase

from wick import __version__
from wick.engine.async_engine import AsyncEngine, EngineDeadError
from wick.entrypoints.openai.errors import OpenAIError, bad_request, engine_dead
from wick.entrypoints.openai.protocol import SamplingRequest
from wick.entrypoints.openai.serving_models import ServingModels
from wick.outputs import CompletionOutput, RequestOutput
from wick.sampling_params import SamplingParams
from wick.tokenizer.chat_template import apply_chat_template

SYSTEM_FINGERPRINT = f"wick-{__version__}"
# How often a non-streaming request looks whether its client is still there.
_DISCONNECT_POLL_S = 0.5

# apply_chat_template's own parameters, which chat_template_kwargs must not repeat.
_TEMPLATE_ARGUMENTS = frozenset({"tokenizer", "messages", "add_generation_prompt", "tools", "chat_template",
                                 "continue_final_message"})
DONE = "data: [DONE]\n\n"

T = TypeVar("T")


def sse(data: dict[str, Any]) -> str:
    """One Server-Sent Event carrying `data` as JSON."""
    return f"data: {json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(',', ':'))}\n\n"


def finite(logprob: float) -> float:
    """JSON has no -inf: a token that could not be sampled gets OpenAI's floor of -9999."""
    return max(logprob, -9999.0)


class ChoiceCursor:
    """How much of one choice's cumulative output a stream has already sent."""

    def __init__(self) -> None:
        self.num_chars = 0
        self.num_tokens = 0
        self.finished = False

    def new_text(self, output: CompletionOutput) -> str:
        text = output.text[self.num_chars:]
        self.num_chars = max(self.num_chars, len(output.text))
        return text

    def new_tokens(self, output: CompletionOutput) -> range:
        start, self.num_tokens = self.num_tokens, len(output.token_ids)
        return range(start, self.num_tokens)


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(num_prompt_tokens: int, num_completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": num_prompt_tokens, "completion_tokens": num_completion_tokens,
            "total_tokens": num_prompt_tokens + num_completion_tokens}


class OpenAIServing:
    def __init__(self, engine: AsyncEngine, models: ServingModels, chat_template: str | None = None) -> None:
        self.engine = engine
        self.models = models
        self.tokenizer = engine.tokenizer
        self.chat_template = chat_template

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                    add_generation_prompt: bool, continue_final_message: bool,
                    template_kwargs: dict[str, Any] | None) -> tuple[str, list[int]]:
        """The prompt text and token ids of a conversation; 400 when the chat template refuses it."""
        template_kwargs = template_kwargs or {}
        clash = _TEMPLATE_ARGUMENTS & template_kwargs.keys()
        if clash:
            raise bad_request(f"chat_template_kwargs cannot set {', '.join(sorted(clash))}", "chat_template_kwargs")
        try:
            text = apply_chat_template(
                self.tokenizer, messages, add_generation_prompt=add_generation_prompt, tools=tools,
                chat_template=self.chat_template, continue_final_message=continue_final_message, **template_kwargs)
        except ValueError as e:
            raise bad_request(str(e), "messages") from e
        return text, self.encode(text, "messages", add_special_tokens=False)

    def encode(self, text: str, param: str, add_special_tokens: bool = True) -> list[int]:
        """The token ids of `text`; 400 without tokenizing when the text is too long to fit the context
        whatever its tokens: every token stands for at most `longest_token_chars` characters."""
        max_model_len = self.engine.max_model_len
        max_chars = max_model_len * longest_token_chars(self.tokenizer)
        if len(text) > max_chars:
            raise bad_request(f"the prompt has {len(text)} characters, more than this model's context of "
                              f"{max_model_len} tokens can hold (at most {max_chars} characters)", param)
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens)

    def response_header(self, request_id: str, object_name: str, model: str) -> dict[str, object]:
        return {"id": request_id, "object": object_name, "created": int(time.time()), "model": model,
                "system_fingerprint": SYSTEM_FINGERPRINT}

    def check_token_ids(self, token_ids: list[int], param: str) -> None:
        vocab_size = self.engine.vocab_size
        for token_id in token_ids:
            if not 0 <= token_id < vocab_size:
                raise bad_request(f"token id {token_id} is outside the vocabulary [0, {vocab_size})", param)

    def max_tokens(self, request: SamplingRequest, num_prompt_tokens: int, prompt_param: str) -> int:
        """The requested max_tokens, or the default (bounded by the room the context leaves); 400 when the prompt
        does not fit."""
        max_model_len = self.engine.max_model_len
        room = max_model_len - num_prompt_tokens
        if room < 1:
            raise bad_request(f"the prompt has {num_prompt_tokens} tokens, but this model's context holds "
                              f"{max_model_len} tokens including at least one to generate", prompt_param)
        requested = request.requested_max_tokens
        if requested is None:
            return self.engine.sampling_defaults.max_tokens_for(room, max_model_len)
        if requested > room:
            raise bad_request(f"the prompt has {num_prompt_tokens} tokens and max_tokens is {requested}: "
                              f"together more than this model's context of {max_model_len} tokens", "max_tokens")
        return requested

    @staticmethod
    def sampling_params(build: Callable[[], SamplingParams]) -> SamplingParams:
        try:
            return build()
        except ValueError as e:
            raise bad_request(str(e), str(e).split(" ", 1)[0]) from e

    async def generate(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                       params: SamplingParams) -> AsyncIterator[RequestOutput]:
        """The engine's outputs for one request; closing this iterator aborts the request."""
        stream = self.engine.generate(request_id, prompt, prompt_token_ids, params)
        try:
            async for output in stream:
                yield output
        except ValueError as e:
            raise bad_request(str(e)) from e
        except EngineDeadError as e:
            raise engine_dead() from e
        finally:
            await stream.aclose()


@functools.cache
def longest_token_chars(tokenizer: PreTrainedTokenizerBase) -> int:
    """An upper bound on the characters of text one token stands for: the longest entry of the vocabulary.

    A byte-level vocabulary spells each byte as one character, and a character is at least one byte; a
    SentencePiece vocabulary spells its text as is (byte fallback tokens `<0x..>` are longer than the byte)."""
    return max(len(token) for token in tokenizer.get_vocab())


async def merge(streams: list[AsyncIterator[T]]) -> AsyncIterator[tuple[int, T]]:
    """Items of several streams as they come, tagged with the index of their stream. The first error
    of any stream ends the merge; leaving early closes every stream."""
    if len(streams) == 1:
        async for item in streams[0]:
            yield 0, item
        return
    queue: asyncio.Queue[tuple[int, T] | BaseException | None] = asyncio.Queue()

    async def pump(index: int, stream: AsyncIterator[T]) -> None:
        try:
            async for item in stream:
                await queue.put((index, item))
            await queue.put(None)
        except Exception as e:
            await queue.put(e)

    tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
    try:
        remaining = len(tasks)
        while remaining:
            item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def unless_disconnected(raw_request: Request, work: Awaitable[T]) -> T:
    """Runs `work` (a non-streaming request) and cancels it when the client goes away."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=_DISCONNECT_POLL_S)
            if done:
                return task.result()
            if await raw_request.is_disconnected():
                raise OpenAIError(499, "the client closed the request")
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
