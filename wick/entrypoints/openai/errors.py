"""Errors in OpenAI's shape, {"error": {"message", "type", "param", "code"}}, for every failure the
server can meet: no pydantic trace and no traceback ever reaches a client."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from wick.engine.async_engine import EngineDeadError

_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_BYTES = re.compile(rb"\\u[dD][89a-fA-F]|\xed[\xa0-\xbf]")
_CODES = {401: "invalid_api_key", 404: "not_found", 413: "request_too_large", 429: "server_overloaded",
          503: "engine_unavailable"}
_TYPES = {429: "server_overloaded"}
# Validation error details shown per response; the rest are counted.
_MAX_SHOWN = 3


class OpenAIError(Exception):
    """A failure to report to the client with an HTTP status."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code or _CODES.get(status)
        self.headers = headers

    def body(self) -> dict[str, Any]:
        kind = _TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(400, message, param=param)


def engine_dead() -> OpenAIError:
    return OpenAIError(503, "the engine core is gone; the server is shutting down")


def request_too_large(max_body_bytes: int) -> OpenAIError:
    """413; the connection closes after it, so that the rest of the body is never read."""
    return OpenAIError(413, f"the request body exceeds {max_body_bytes} bytes", headers={"Connection": "close"})


def shutting_down() -> OpenAIError:
    return OpenAIError(503, "the server is shutting down and takes no new requests", code="server_shutting_down",
                       headers={"Connection": "close"})


def stopped_by_shutdown() -> OpenAIError:
    """A request the server stopped before it finished: it was still running when the shutdown timeout ran out."""
    return OpenAIError(503, "the server stopped this request before it finished: it is shutting down",
                       code="server_shutting_down")


def from_validation_errors(errors: Sequence[dict[str, Any]]) -> OpenAIError:
    """One 400 naming the fields at fault, from pydantic's error list (without its inputs and URLs)."""
    parts, params = [], []
    for error in errors[:_MAX_SHOWN]:
        path = _field_path(error.get("loc", ()))
        message = str(error.get("msg", "invalid value")).removeprefix("Value error, ")
        parts.append(f"{path}: {message}" if path else message)
        params.append(path)
    if len(errors) > _MAX_SHOWN:
        parts.append(f"and {len(errors) - _MAX_SHOWN} more errors")
    return bad_request("; ".join(parts), params[0] if params and params[0] else None)


def lone_surrogate(data: Any) -> str | None:
    """The path (`messages.0.content`) of the first string in JSON data holding a lone UTF-16 surrogate, which
    JSON's escapes allow and no tokenizer can encode; "" for a key; None when there is none."""
    stack: list[tuple[Any, str]] = [(data, "")]
    while stack:
        value, path = stack.pop()
        if isinstance(value, str):
            if _SURROGATE.search(value):
                return path
        elif isinstance(value, dict):
            for key, item in value.items():
                child = f"{path}.{key}" if path else str(key)
                if _SURROGATE.search(key):
                    return child
                stack.append((item, child))
        elif isinstance(value, list):
            stack.extend((item, f"{path}.{i}" if path else str(i)) for i, item in enumerate(value))
    return None


def may_hold_lone_surrogate(body: bytes) -> bool:
    """Whether JSON text can decode to a string holding a lone surrogate, which lone_surrogate then finds:
    json.loads decodes with "surrogatepass", so a UTF-8 body holds one only through a \ud800-\udfff escape or a
    surrogate's UTF-8 bytes; a UTF-16 or UTF-32 body may always."""
    return json.detect_encoding(body) != "utf-8" or _SURROGATE_BYTES.search(body) is not None


def _field_path(loc: Sequence[Any]) -> str:
    """`("body", "messages", 0, "content", "list[TextPart]", 0, "text")` -> `messages.0.content.0.text`.

    pydantic puts the tried member of a union (`str`, `list[TextPart]`, `function-after[...]`) into the
    location; those are types, not fields, and are left out."""
    names = []
    for part in loc:
        if isinstance(part, int):
            names.append(str(part))
        elif part not in ("body", "query", "path") and part.replace("_", "").isalnum() and part[:1].islower() \
                and part not in ("str", "int", "float", "bool", "list", "dict"):
            names.append(part)
    return ".".join(names)


def install_exception_handlers(app: FastAPI) -> None:
    @app.exception_handler(OpenAIError)
    async def _openai_error(_: Request, exc: OpenAIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(EngineDeadError)
    async def _engine_dead(_: Request, __: EngineDeadError) -> JSONResponse:
        return engine_dead().response()

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        return from_validation_errors(exc.errors()).response()

    @app.exception_handler(HTTPException)
    async def _http(_: Request, exc: HTTPException) -> JSONResponse:
        try:
            phrase = HTTPStatus(exc.status_code).phrase
        except ValueError:
            phrase = "error"
        message = exc.detail if isinstance(exc.detail, str) else phrase
        return JSONResponse(OpenAIError(exc.status_code, message).body(), status_code=exc.status_code,
                            headers=exc.headers)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, __: Exception) -> JSONResponse:
        # Starlette re-raises the exception after this response, and uvicorn logs its traceback.
        return OpenAIError(500, "internal server error").response()
