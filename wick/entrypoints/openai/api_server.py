"""The OpenAI-compatible HTTP server: a FastAPI app over one AsyncEngine, run by uvicorn.

Requests are admitted (or refused early, see admission.py) before their body is read; every failure
is answered in OpenAI's error shape. SIGINT / SIGTERM drain the server: new requests get 503, running
ones finish or are stopped at the shutdown timeout, then it exits 0. When the engine core dies,
requests get 503 for a short grace period and then the server stops, so that `serve` returns non-zero."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from types import FrameType
from typing import Any, TypeVar

import uvicorn
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from wick import __version__
from wick.engine.async_engine import AsyncEngine
from wick.entrypoints.openai.admission import Admission, AdmissionGuard
from wick.entrypoints.openai.errors import (
    OpenAIError,
    bad_request,
    engine_dead,
    from_validation_errors,
    install_exception_handlers,
    lone_surrogate,
    may_hold_lone_surrogate,
    shutting_down,
)
from wick.entrypoints.openai.load_limits import LoadLimits
from wick.entrypoints.openai.metrics import ServerMetrics
from wick.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
)
from wick.entrypoints.openai.serving_chat import ServingChat
from wick.entrypoints.openai.serving_completion import ServingCompletion
from wick.entrypoints.openai.serving_embedding import ServingEmbedding
from wick.entrypoints.openai.serving_mcp import McpChat
from wick.entrypoints.openai.serving_models import ServingModels
from wick.entrypoints.openai.serving_tokenization import ServingTokenization
from wick.entrypoints.webui import mount_webui
from wick.mcp import McpHub, ServerConfig
from wick.tools.registry import get_reasoning_parser
from wick.tools.tool_choice import resolve_tool_parser

logger = logging.getLogger(__name__)

MAX_JSON_DEPTH = 64
DEFAULT_LIMITS = LoadLimits()
# How often the server looks at the engine (is it alive? finished requests' latencies).
_WATCH_INTERVAL_S = 0.5
# How long a server whose engine died keeps answering 503 before it stops.
_DEAD_GRACE_S = 2.0
# How long uvicorn waits for open connections once the drain is over (or the engine died).
_GRACEFUL_SHUTDOWN_S = 5
# How long the streams stopped at the end of a drain get to send their last events.
_STOPPED_FLUSH_S = 5.0

M = TypeVar("M", bound=BaseModel)


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
    # Both walks visit every value (a prompt of token ids is thousands); the body's bytes say when they need not.
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH and _depth(data) > MAX_JSON_DEPTH:
        raise bad_request(f"the body nests deeper than {MAX_JSON_DEPTH} levels")
    where = lone_surrogate(data) if may_hold_lone_surrogate(body) else None
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
              limits: LoadLimits = DEFAULT_LIMITS, webui: bool = False,
              mcp_servers: dict[str, ServerConfig] | None = None, tool_call_parser: str | None = None,
              reasoning_parser: str | None = None) -> FastAPI:
    """`tool_call_parser` names the tool-call format (default: the one the chat template implies, if any).
    `app.state.admission` is the server's Admission: set its `draining` to refuse new requests."""
    admission = Admission(engine, limits.max_queued_requests)
    models = ServingModels(served_model_names or [engine.model_name], engine.model_name, engine.max_model_len)
    chat = ServingChat(engine, models, chat_template,
                       tool_parser=resolve_tool_parser(tool_call_parser, engine.tokenizer, chat_template),
                       reasoning_parser=get_reasoning_parser(reasoning_parser) if reasoning_parser else None)
    completion = ServingCompletion(engine, models, chat_template)
    tokenization = ServingTokenization(engine, models, chat_template)
    embedding = ServingEmbedding(engine, models)
    metrics = ServerMetrics(engine, admission)
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
        watcher = asyncio.create_task(_watch(engine, metrics, admission, app, on_engine_dead))
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
    app.state.admission = admission
    install_exception_handlers(app)
    app.add_middleware(AdmissionGuard, admission=admission, api_key=api_key, max_body_bytes=limits.max_body_bytes)
    router = APIRouter()

    @router.get("/health")
    async def health() -> Response:
        if engine.is_dead:
            raise engine_dead()
        if admission.draining:
            raise shutting_down()
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

    def generates(body: ChatCompletionRequest | CompletionRequest) -> None:
        if engine.pooler_config is not None:
            raise bad_request(f"the model `{models.resolve(body.model)}` is an embedding model: it serves "
                              "/v1/embeddings only, not text generation", "model")

    @router.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await parse_body(request, ChatCompletionRequest)
        generates(body)
        return await chat.create(body, request)

    @router.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await parse_body(request, CompletionRequest)
        generates(body)
        return await completion.create(body, request)

    @router.post("/v1/embeddings")
    async def embeddings(request: Request) -> Response:
        return await embedding.create(await parse_body(request, EmbeddingRequest), request)

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


async def _watch(engine: AsyncEngine, metrics: ServerMetrics, admission: Admission, app: FastAPI,
                 on_engine_dead: Callable[[], None]) -> None:
    while not engine.is_dead:
        await asyncio.sleep(_WATCH_INTERVAL_S)
        metrics.collect_latencies()
        admission.sample_start_rate()
    app.state.engine_died = True
    logger.error("the engine core is gone: answering 503 for %.0f s, then stopping", _DEAD_GRACE_S)
    await asyncio.sleep(_DEAD_GRACE_S)
    on_engine_dead()


class _Server(uvicorn.Server):
    """uvicorn's server, logging where it listens, and draining on SIGINT / SIGTERM: no new requests,
    the running ones finish within `shutdown_timeout` seconds or are stopped, then the server stops.
    A second signal stops it at once. The signal is not re-raised afterwards (uvicorn's default), so
    that the caller can clean up and choose the exit code."""

    def __init__(self, config: uvicorn.Config, url: str, banner: str, engine: AsyncEngine, admission: Admission,
                 shutdown_timeout: float) -> None:
        super().__init__(config)
        self._url = url
        self._banner = banner
        self._engine = engine
        self._admission = admission
        self._shutdown_timeout = shutdown_timeout
        self._loop: asyncio.AbstractEventLoop | None = None
        self._drain: asyncio.Task | None = None
        self.forced_by: int | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._admission.draining or self._loop is None:
            logger.warning("second signal: stopping at once")
            self.forced_by = sig
            self.force_exit = self.should_exit = True
            return
        self._admission.draining = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._drain = asyncio.create_task(self._drain_requests())

    async def _drain_requests(self) -> None:
        admission = self._admission
        logger.info("draining: no new requests; %d running may take up to %.0f s (a second signal stops at once)",
                    admission.in_flight, self._shutdown_timeout)
        if not await _until(lambda: admission.in_flight == 0, self._shutdown_timeout):
            stopped = self._engine.abort_all()
            logger.warning("shutdown timeout: stopped %d unfinished requests", stopped)
            await _until(lambda: admission.in_flight == 0, _STOPPED_FLUSH_S)
        self.should_exit = True

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)
        if self.started:
            logger.info("%s; ready at %s (OpenAI API at %s/v1)", self._banner, self._url, self._url)


async def _until(condition: Callable[[], bool], timeout: float) -> bool:
    """Waits until `condition()` holds or `timeout` seconds pass; returns whether it holds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(0.05)
    return True


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
                reasoning_parser: str | None = None, limits: LoadLimits = DEFAULT_LIMITS,
                uvicorn_log_level: str = "info") -> int:
    """Serves until SIGINT / SIGTERM or the engine core's death. Returns the exit code: 0 after a drain,
    1 when the engine died, 128 + the signal's number when a second signal cut the drain short."""
    host, port = sock.getsockname()[:2]
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"

    def stop() -> None:
        server.should_exit = True

    app = build_app(engine, served_model_names=served_model_names, api_key=api_key, chat_template=chat_template,
                    on_engine_dead=stop, webui=webui, mcp_servers=mcp_servers, tool_call_parser=tool_call_parser,
                    reasoning_parser=reasoning_parser, limits=limits)
    config = uvicorn.Config(app, log_config=None, log_level=uvicorn_log_level,
                            timeout_graceful_shutdown=_GRACEFUL_SHUTDOWN_S)
    banner = f"serving {', '.join(served_model_names or [engine.model_name])} (engine core pid " \
             f"{engine.client.process.pid})"
    server = _Server(config, url, banner, engine, app.state.admission, limits.shutdown_timeout)
    await server.serve(sockets=[sock])
    if app.state.engine_died:
        return 1
    return 0 if server.forced_by is None else 128 + server.forced_by
