"""The OpenAI-compatible HTTP server: a FastAPI app over one AsyncEngine, run by uvicorn.

Every /v1 route wants the API key when one is set; bodies are capped in size; every failure is
answered in OpenAI's error shape. When the engine core dies, requests get 503 for a short grace
period and then the server stops, so that `serve` returns non-zero."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import signal
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from wick import __version__
from wick.engine.async_engine import AsyncEngine
from wick.entrypoints.openai.errors import (
    OpenAIError,
    bad_request,
    engine_dead,
    from_validation_errors,
    install_exception_handlers,
    lone_surrogate,
)
from wick.entrypoints.openai.metrics import ServerMetrics
from wick.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from wick.entrypoints.openai.serving_chat import ServingChat
from wick.entrypoints.openai.serving_completion import ServingCompletion
from wick.entrypoints.openai.serving_mcp import McpChat
from wick.entrypoints.openai.serving_models import ServingModels
from wick.entrypoints.openai.serving_tokenization import ServingTokenization
from wick.entrypoints.webui import mount_webui
from wick.mcp import McpHub, ServerConfig
from wick.tools.registry import get_reasoning_parser
from wick.tools.tool_choice import resolve_tool_parser

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 32 << 20
MAX_JSON_DEPTH = 64
# How often the server looks at the engine (is it alive? finished requests' latencies).
_WATCH_INTERVAL_S = 0.5
# How long a server whose engine died keeps answering 503 before it stops.
_DEAD_GRACE_S = 2.0
# How long a stopping server waits for open requests before cancelling them.
_GRACEFUL_SHUTDOWN_S = 5

M = TypeVar("M", bound=BaseModel)


class _Guard:
    """ASGI middleware: the API key on /v1 routes, and the body size limit (declared and actual)."""

    def __init__(self, app: ASGIApp, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        if self.api_key is not None and scope["path"].startswith("/v1") and not self._authorized(headers):
            error = OpenAIError(401, "Incorrect or missing API key; send it as 'Authorization: Bearer <key>'.")
            await error.response()(scope, receive, send)
            return
        declared = headers.get(b"content-length", b"0")
        if not declared.isdigit() or int(declared) > self.max_body_bytes:
            await self._too_large().response()(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise self._too_large()
            return message

        await self.app(scope, limited_receive, send)

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(key.strip(), self.api_key or b"")

    def _too_large(self) -> OpenAIError:
        return OpenAIError(413, f"the request body exceeds {self.max_body_bytes} bytes")


async def parse_body(request: Request, model: type[M]) -> M:
    """The JSON body as `model`; 415 for another content type, 400 for bad JSON or bad fields."""
    content_type = request.headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise OpenAIError(415, f"the body must be application/json, not {content_type}")
    body = await request.body()
    try:
        data = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise bad_request("the body is not valid JSON (or nests too deep, or holds a number too long)") from e
    if _depth(data) > MAX_JSON_DEPTH:
        raise bad_request(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    where = lone_surrogate(data)
    if where is not None:
        raise bad_request(f"{where or 'the body'}: a string holds a lone UTF-16 surrogate (\\ud800-\\udfff "
                          "without its pair), which is not text", where or None)
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise from_validation_errors(e.errors(include_url=False, include_input=False, include_context=False)) from e


def _depth(data: Any) -> int:
    """How deep JSON data nests, found without recursion (chat templates and pydantic do recurse)."""
    deepest, stack = 0, [(data, 1)] if isinstance(data, dict | list) else []
    while stack:
        value, depth = stack.pop()
        deepest = max(deepest, depth)
        items = value.values() if isinstance(value, dict) else value
        stack.extend((item, depth + 1) for item in items if isinstance(item, dict | list))
    return deepest


def build_app(engine: AsyncEngine, *, served_model_names: list[str] | None = None, api_key: str | None = None,
              chat_template: str | None = None, on_engine_dead: Callable[[], None] = lambda: None,
              max_body_bytes: int = MAX_BODY_BYTES, webui: bool = False,
              mcp_servers: dict[str, ServerConfig] | None = None, tool_call_parser: str | None = None,
              reasoning_parser: str | None = None) -> FastAPI:
    """`tool_call_parser` names the tool-call format (default: the one the chat template implies, if any)."""
    models = ServingModels(served_model_names or [engine.model_name], engine.model_name, engine.max_model_len)
    chat = ServingChat(engine, models, chat_template,
                       tool_parser=resolve_tool_parser(tool_call_parser, engine.tokenizer, chat_template),
                       reasoning_parser=get_reasoning_parser(reasoning_parser) if reasoning_parser else None)
    completion = ServingCompletion(engine, models, chat_template)
    tokenization = ServingTokenization(engine, models, chat_template)
    metrics = ServerMetrics(engine)
    mcp_hub = McpHub(mcp_servers) if mcp_servers else None
    if mcp_hub is not None:
        if chat.tool_parser is None:
            raise ValueError("--mcp-config needs the model's tool-call format, which its chat template does not "
                             "show: name it with --tool-call-parser")
        chat.mcp = McpChat(mcp_hub)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if mcp_hub is not None:
            await mcp_hub.start()
        watcher = asyncio.create_task(_watch(engine, metrics, app, on_engine_dead))
        try:
            yield
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            if mcp_hub is not None:
                await mcp_hub.close()

    app = FastAPI(title="wick", version=__version__, lifespan=lifespan, docs_url=None, redoc_url=None,
                  openapi_url=None)
    app.state.engine_died = False
    install_exception_handlers(app)
    app.add_middleware(_Guard, api_key=api_key, max_body_bytes=max_body_bytes)
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        if engine.is_dead:
            raise engine_dead()
        return Response(status_code=200)

    @router.api_route("/ping", methods=["GET", "POST"])
    async def ping() -> Response:
        """vLLM's (and SageMaker's) liveness route: /health under another name."""
        return await health()

    @router.get("/version")
    async def version() -> dict[str, str]:
        return {"version": __version__}

    @router.get("/metrics")
    async def prometheus() -> Response:
        body, content_type = metrics.render()
        return Response(body, media_type=content_type)

    @router.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        return models.list()

    @router.get("/v1/models/{model_name:path}")
    async def model_card(model_name: str) -> dict[str, Any]:
        return models.card(models.resolve(model_name))

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await chat.create(await parse_body(request, ChatCompletionRequest), request)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await completion.create(await parse_body(request, CompletionRequest), request)

    @router.post("/tokenize")
    async def tokenize(request: Request) -> JSONResponse:
        return JSONResponse(tokenization.tokenize(await parse_body(request, TokenizeRequest)))

    @router.post("/detokenize")
    async def detokenize(request: Request) -> JSONResponse:
        return JSONResponse(tokenization.detokenize(await parse_body(request, DetokenizeRequest)))

    app.include_router(router)
    if webui:
        mount_webui(app)
    return app


async def _watch(engine: AsyncEngine, metrics: ServerMetrics, app: FastAPI, on_engine_dead: Callable[[], None]) -> None:
    while not engine.is_dead:
        await asyncio.sleep(_WATCH_INTERVAL_S)
        metrics.collect_latencies()
    app.state.engine_died = True
    logger.error("the engine core is gone: answering 503 for %.0f s, then stopping", _DEAD_GRACE_S)
    await asyncio.sleep(_DEAD_GRACE_S)
    on_engine_dead()


class _Server(uvicorn.Server):
    """uvicorn's server, logging where it listens, and stopping on SIGINT / SIGTERM without re-raising
    the signal afterwards (uvicorn's default), so that the caller can clean up and choose the exit code."""

    def __init__(self, config: uvicorn.Config, url: str, banner: str) -> None:
        super().__init__(config)
        self._url = url
        self._banner = banner

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            logger.info("%s; ready at %s (OpenAI API at %s/v1)", self._banner, self._url, self._url)


def listen(host: str, port: int) -> socket.socket:
    """A listening socket, bound before the model loads so that a taken port fails at once."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


async def serve(engine: AsyncEngine, sock: socket.socket, *, served_model_names: list[str] | None = None,
                api_key: str | None = None, chat_template: str | None = None, webui: bool = False,
                mcp_servers: dict[str, ServerConfig] | None = None, tool_call_parser: str | None = None,
                reasoning_parser: str | None = None, uvicorn_log_level: str = "info") -> bool:
    """Serves until SIGINT / SIGTERM or the engine core's death; returns whether the engine died."""
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def stop() -> None:
        server.should_exit = True

    app = build_app(engine, served_model_names=served_model_names, api_key=api_key, chat_template=chat_template,
                    on_engine_dead=stop, webui=webui, mcp_servers=mcp_servers, tool_call_parser=tool_call_parser,
                    reasoning_parser=reasoning_parser)
    config = uvicorn.Config(app, log_config=None, log_level=uvicorn_log_level,
                            timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S)
    banner = f"serving {', '.join(served_model_names or [engine.model_name])} (engine core pid " \
             f"{engine.client.process.pid})"
    server = _Server(config, url, banner)
    await server.serve(sockets=[sock])
    return bool(app.state.engine_died)
