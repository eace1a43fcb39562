"""POST /v1/chat/completions, in OpenAI's shapes: one JSON response, or Server-Sent Events chunks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from starlette.requests import Request
from starlette.responses import Response

from wick.entrypoints.openai.errors import OpenAIError
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
from wick.outputs import CompletionOutput, PositionLogprobs, RequestOutput


class ServingChat(OpenAIServing):
    async def create(self, request: ChatCompletionRequest, raw_request: Request) -> Response:
        model = self.models.resolve(request.model)
        prompt, prompt_token_ids = self.render_chat(
            request.template_messages(), request.tools, request.add_generation_prompt,
            request.continue_final_message, request.chat_template_kwargs)
        max_tokens = self.max_tokens(request, len(prompt_token_ids), "messages")
        params = self.sampling_params(lambda: request.sampling_params(max_tokens, request.num_logprobs))
        request_id = random_id("chatcmpl")
        outputs = self.generate(request_id, prompt, prompt_token_ids, params)
        if request.stream:
            # The first output comes before the response starts, so that a refused request gets its status.
            first = await unless_disconnected(raw_request, anext(outputs, None))
            if first is None:
                raise OpenAIError(500, "the request ended without an output")
            header = self.response_header(request_id, "chat.completion.chunk", model)
            return StreamingResponse(self._stream(request, header, first, outputs), media_type="text/event-stream")
        final = await unless_disconnected(raw_request, _last(outputs))
        header = self.response_header(request_id, "chat.completion", model)
        return JSONResponse(self._response(request, header, final))

    def _response(self, request: ChatCompletionRequest, header: dict[str, Any],
                  final: RequestOutput) -> dict[str, Any]:
        choices = [{
            "index": output.index,
            "message": {"role": "assistant", "content": output.text},
            "logprobs": self._logprobs(request, output, range(len(output.token_ids))),
            "finish_reason": output.finish_reason,
        } for output in final.outputs]
        num_generated = sum(len(o.token_ids) for o in final.outputs)
        return {**header, "choices": choices, "usage": usage(len(final.prompt_token_ids), num_generated)}

    async def _stream(self, request: ChatCompletionRequest, header: dict[str, Any], first: RequestOutput,
                      outputs: AsyncIterator[RequestOutput]) -> AsyncIterator[str]:
        cursors = [ChoiceCursor() for _ in range(request.n)]
        try:
            for index in range(request.n):
                yield sse({**header, "choices": [{"index": index, "delta": {"role": "assistant", "content": ""},
                                                  "logprobs": None, "finish_reason": None}]})
            output: RequestOutput | None = first
            while output is not None:
                for sample in output.outputs:
                    for chunk in self._chunks(request, header, sample, cursors[sample.index]):
                        yield chunk
                last, output = output, await anext(outputs, None)
            if request.include_usage:
                num_generated = sum(len(o.token_ids) for o in last.outputs)
                yield sse({**header, "choices": [], "usage": usage(len(last.prompt_token_ids), num_generated)})
        except OpenAIError as e:
            yield sse(e.body())
        finally:
            await outputs.aclose()
        yield DONE

    def _chunks(self, request: ChatCompletionRequest, header: dict[str, Any], sample: CompletionOutput,
                cursor: ChoiceCursor) -> list[str]:
        if cursor.finished:
            return []
        text = cursor.new_text(sample)
        logprobs = self._logprobs(request, sample, cursor.new_tokens(sample))
        chunks = []
        if text or (logprobs and logprobs["content"]):
            chunks.append(sse({**header, "choices": [{"index": sample.index, "delta": {"content": text},
                                                      "logprobs": logprobs, "finish_reason": None}]}))
        if sample.finished:
            cursor.finished = True
            chunks.append(sse({**header, "choices": [{"index": sample.index, "delta": {}, "logprobs": None,
                                                      "finish_reason": sample.finish_reason}]}))
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


async def _last(outputs: AsyncIterator[RequestOutput]) -> RequestOutput:
    final = None
    async with aclosing(outputs):
        async for output in outputs:
            final = output
    if final is None:
        raise OpenAIError(500, "the request ended without an output")
    return final
