"""POST /v1/embeddings, in OpenAI's shape: one embedding per input, as floats or as base64 of little-endian
float32 (OpenAI's encoding), with the prompt tokens counted in `usage`."""

from __future__ import annotations

import asyncio
import base64
import time

import numpy as np
from fastapi.responses import JSONResponse
from starlette.requests import Request

from wick.engine.async_engine import EngineDeadError
from wick.entrypoints.openai.errors import bad_request, engine_dead, stopped_by_shutdown
from wick.entrypoints.openai.protocol import EmbeddingRequest
from wick.entrypoints.openai.serving_engine import OpenAIServing, random_id, unless_disconnected
from wick.outputs import EmbeddingRequestOutput
from wick.pooling_params import PoolingParams
from wick.tokenizer.embedding_inputs import tokenize_for_embedding


class ServingEmbedding(OpenAIServing):
    async def create(self, request: EmbeddingRequest, raw_request: Request) -> JSONResponse:
        model = self.models.resolve(request.model)
        pooler = self.engine.pooler_config
        if pooler is None:
            raise bad_request(f"the model `{model}` generates text and serves no embeddings; serve an embedding "
                              "model (a sentence-transformers folder, or any model with --task embed)", "model")
        params = PoolingParams(dimensions=request.dimensions, normalize=request.normalize)
        try:
            pooler.check(params)
        except ValueError as e:
            raise bad_request(str(e), "dimensions") from e
        inputs = request.inputs()
        for ids in inputs:
            if not isinstance(ids, str):
                self.check_token_ids(ids, "input")
        try:
            token_ids = tokenize_for_embedding(self.tokenizer, inputs, self.engine.max_model_len,
                                               request.truncate_prompt_tokens)
        except ValueError as e:
            param = "truncate_prompt_tokens" if str(e).startswith("truncate_prompt_tokens") else "input"
            raise bad_request(str(e), param) from e
        request_id = random_id("embd")
        results = await unless_disconnected(raw_request, self._embed_all(request_id, token_ids, params))
        data = [{"object": "embedding", "index": i, "embedding": _encoded(r.outputs.embedding, request.encoding_format)}
                for i, r in enumerate(results)]
        num_tokens = sum(len(ids) for ids in token_ids)
        return JSONResponse({"id": request_id, "object": "list", "created": int(time.time()), "model": model,
                             "data": data, "usage": {"prompt_tokens": num_tokens, "total_tokens": num_tokens}})

    async def _embed_all(self, request_id: str, token_ids: list[list[int]],
                         params: PoolingParams) -> list[EmbeddingRequestOutput]:
        """Every input side by side in the engine; the first failure stops the others."""
        tasks = [asyncio.ensure_future(self.engine.embed(f"{request_id}-{i}", ids, params))
                 for i, ids in enumerate(token_ids)]
        try:
            results = await asyncio.gather(*tasks)
        except ValueError as e:
            raise bad_request(str(e), "input") from e
        except EngineDeadError as e:
            raise engine_dead() from e
        finally:
            for task in tasks:
                task.cancel()
        if any(result is None for result in results):
            raise stopped_by_shutdown()
        return results


def _encoded(embedding: list[float], encoding_format: str) -> list[float] | str:
    if encoding_format == "float":
        return embedding
    return base64.b64encode(np.asarray(embedding, dtype="<f4").tobytes()).decode("ascii")

