"""POST /v1/completions, in OpenAI's shapes: one JSON response, or Server-Sent Events chunks.

A request with several prompts runs them side by side; choice `prompt_index * n + sample_index`
belongs to prompt `prompt_index`, as OpenAI numbers them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request
from starlette.responses import Response

from wick.entrypoints.openai.errors import OpenAIError, stopped_by_shutdown
from wick.entrypoints.openai.protocol import CompletionRequest
from wick.entrypoints.openai.serving_engine import (
    DONE,
    ChoiceCursor,
    OpenAIServing,
    finite,
    merge,
    random_id,
    sse,
    unless_disconnected,
    usage,
)
from wick.entrypoints.openai.structured_outputs import structured_outputs
from wick.outputs import CompletionOutput, PositionLogprobs, RequestOutput


@dataclass
class _Prompt:
    text: str | None
    token_ids: list[int]


class ServingCompletion(OpenAIServing):
    async def create(self, request: CompletionRequest, raw_request: Request) -> Response:
        model = self.models.resolve(request.model)
        prompts = [self._encode(p, request.echo) for p in request.prompts()]
        echo_logprobs = request.logprobs if request.echo else None
        request_id = random_id("cmpl")
        constraint = structured_outputs(request)
        streams = []
        for i, prompt in enumerate(prompts):
            max_tokens = self.max_tokens(request, len(prompt.token_ids), "prompt")
            params = self.sampling_params(lambda m=max_tokens: request.sampling_params(
                m, request.logprobs, echo_logprobs, constraint, self.engine.sampling_defaults))
            streams.append(self.generate(f"{request_id}-{i}", prompt.text, prompt.token_ids, params))
        outputs = merge(streams)
        if request.stream:
            # The first output comes before the response starts, so that a refused request gets its status.
            first = await unless_disconnected(raw_request, anext(outputs, None))
            if first is None:
                raise stopped_by_shutdown()
            header = self.response_header(request_id, "text_completion", model)
            return StreamingResponse(self._stream(request, header, prompts, first, outputs),
                                     media_type="text/event-stream")
        finals = await unless_disconnected(raw_request, _finals(outputs, len(prompts)))
        header = self.response_header(request_id, "text_completion", model)
        return JSONResponse(self._response(request, header, prompts, finals))

    def _encode(self, prompt: str | list[int], echo: bool) -> _Prompt:
        """A prompt of token ids is decoded only to be echoed (as vLLM's has no text otherwise)."""
        if isinstance(prompt, str):
            return _Prompt(prompt, self.encode(prompt, "prompt"))
        self.check_token_ids(prompt, "prompt")
        return _Prompt(self.tokenizer.decode(prompt) if echo else None, prompt)

    def _response(self, request: CompletionRequest, header: dict[str, Any], prompts: list[_Prompt],
                  finals: list[RequestOutput]) -> dict[str, Any]:
        choices = []
        for prompt_index, (prompt, final) in enumerate(zip(prompts, finals, strict=True)):
            for sample in final.outputs:
                echoed = (prompt.text or "") if request.echo else ""
                logprobs = self._sample_logprobs(request, sample, range(len(sample.token_ids)), len(echoed))
                if request.echo and logprobs is not None:
                    logprobs = _join(self._prompt_logprobs(request, prompt, final), logprobs)
                choices.append({"index": prompt_index * request.n + sample.index, "text": echoed + sample.text,
                                "logprobs": logprobs, "finish_reason": sample.finish_reason,
                                "stop_reason": sample.stop_reason})
        num_prompt = sum(len(p.token_ids) for p in prompts)
        num_generated = sum(len(s.token_ids) for f in finals for s in f.outputs)
        return {**header, "choices": choices, "usage": usage(num_prompt, num_generated)}

    async def _stream(self, request: CompletionRequest, header: dict[str, Any], prompts: list[_Prompt],
                      first: tuple[int, RequestOutput], outputs: AsyncIterator[tuple[int, RequestOutput]],
                      ) -> AsyncIterator[str]:
        cursors = [[ChoiceCursor() for _ in range(request.n)] for _ in prompts]
        latest: dict[int, RequestOutput] = {}
        try:
            item: tuple[int, RequestOutput] | None = first
            while item is not None:
                prompt_index, output = item
                prompt = prompts[prompt_index]
                for sample in output.outputs:
                    cursor = cursors[prompt_index][sample.index]
                    if prompt_index not in latest and request.echo:
                        yield self._chunk(header, prompt_index * request.n + sample.index, prompt.text or "",
                                          self._prompt_logprobs(request, prompt, output), None)
                    for chunk in self._chunks(request, header, prompt_index * request.n, sample, cursor, prompt):
                        yield chunk
                latest[prompt_index] = output
                item = await anext(outputs, None)
            for prompt_index, prompt_cursors in enumerate(cursors):
                for sample_index, cursor in enumerate(prompt_cursors):
                    if not cursor.finished:  # stopped by the server's shutdown
                        yield self._chunk(header, prompt_index * request.n + sample_index, "", None, "abort")
            if request.include_usage:
                num_prompt = sum(len(p.token_ids) for p in prompts)
                num_generated = sum(len(s.token_ids) for f in latest.values() for s in f.outputs)
                yield sse({**header, "choices": [], "usage": usage(num_prompt, num_generated)})
        except OpenAIError as e:
            yield sse(e.body())
        finally:
            await outputs.aclose()
        yield DONE

    def _chunks(self, request: CompletionRequest, header: dict[str, Any], first_index: int, sample: CompletionOutput,
                cursor: ChoiceCursor, prompt: _Prompt) -> list[str]:
        if cursor.finished:
            return []
        index = first_index + sample.index
        offset = (len(prompt.text or "") if request.echo else 0) + cursor.num_chars
        text = cursor.new_text(sample)
        logprobs = self._sample_logprobs(request, sample, cursor.new_tokens(sample), offset)
        chunks = []
        if text or (logprobs and logprobs["tokens"]):
            chunks.append(self._chunk(header, index, text, logprobs, None))
        if sample.finished:
            cursor.finished = True
            chunks.append(self._chunk(header, index, "", None, sample.finish_reason, sample.stop_reason))
        return chunks

    @staticmethod
    def _chunk(header: dict[str, Any], index: int, text: str, logprobs: dict[str, Any] | None,
               finish_reason: str | None, stop_reason: int | str | None = None) -> str:
        """`stop_reason` (vLLM's): the stop string or stop token id that ended the choice; None for EOS or length."""
        return sse({**header, "choices": [{"index": index, "text": text, "logprobs": logprobs,
                                           "finish_reason": finish_reason, "stop_reason": stop_reason}]})

    def _sample_logprobs(self, request: CompletionRequest, sample: CompletionOutput, positions: range,
                         offset: int) -> dict[str, Any] | None:
        if request.logprobs is None or sample.logprobs is None:
            return None
        positions = range(positions.start, min(positions.stop, len(sample.logprobs)))
        return self._legacy([sample.token_ids[i] for i in positions], [sample.logprobs[i] for i in positions],
                            request.logprobs, offset)

    def _prompt_logprobs(self, request: CompletionRequest, prompt: _Prompt,
                         output: RequestOutput) -> dict[str, Any] | None:
        if request.logprobs is None or output.prompt_logprobs is None:
            return None
        return self._legacy(prompt.token_ids, output.prompt_logprobs, request.logprobs, 0)

    def _legacy(self, token_ids: list[int], positions: list[PositionLogprobs | None], num_top: int,
                offset: int) -> dict[str, Any]:
        """OpenAI's legacy completions logprobs: {tokens, token_logprobs, top_logprobs, text_offset}.

        top_logprobs holds the `num_top` likeliest tokens and the chosen one, as OpenAI returns them."""
        result: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, position in zip(token_ids, positions, strict=False):
            def text(tid: int, where: PositionLogprobs | None = position) -> str:
                decoded = where[tid].decoded_token if where and tid in where else None
                return decoded if decoded is not None else self.tokenizer.decode([tid])

            token = text(token_id)
            result["tokens"].append(token)
            result["text_offset"].append(offset)
            offset += len(token)
            if position is None:
                result["token_logprobs"].append(None)
                result["top_logprobs"].append(None)
                continue
            result["token_logprobs"].append(finite(position[token_id].logprob) if token_id in position else -9999.0)
            ranked = sorted(position, key=lambda tid, p=position: p[tid].rank or 0)[:num_top]
            top = {text(tid): finite(position[tid].logprob) for tid in ranked}
            if token_id in position:
                top.setdefault(token, finite(position[token_id].logprob))
            result["top_logprobs"].append(top)
        return result


def _join(prompt: dict[str, list[Any]] | None, completion: dict[str, list[Any]]) -> dict[str, list[Any]]:
    if prompt is None:
        return completion
    return {key: prompt[key] + completion[key] for key in completion}


async def _finals(outputs: AsyncIterator[tuple[int, RequestOutput]], num_prompts: int) -> list[RequestOutput]:
    finals: dict[int, RequestOutput] = {}
    async with aclosing(outputs):
        async for prompt_index, output in outputs:
            finals[prompt_index] = output
    if len(finals) != num_prompts or not all(final.finished for final in finals.values()):
        raise stopped_by_shutdown()
    return [finals[i] for i in range(num_prompts)]
