"""Which requests the server takes in, decided before their body is read: the API key, the body size
limit (declared and actual), no new requests while draining, and a bound on the generation requests
that wait for their first token (429 with Retry-After past it). Refusals are cheap and counted."""

from __future__ import annotations

import hmac
import math
import time
from collections import Counter

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from wick.engine.async_engine import AsyncEngine
from wick.entrypoints.openai.errors import OpenAIError, request_too_large, shutting_down

GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions"})
# Paths that answer while draining: load balancers read /health to learn that the server is going.
_DRAIN_EXEMPT = frozenset({"/health", "/metrics", "/version"})
# Retry-After bounds, in seconds.
_MIN_RETRY_S, _MAX_RETRY_S = 1, 60
# Weight of the newest sample in the moving average of the rate at which requests start generating.
_RATE_SMOOTHING = 0.3


class Admission:
    """Counts the generation requests in the server; refuses new ones past `max_queued` waiting or while draining.

    A request waits from its arrival until its first token (tokenization, the core's queue, prefill):
    waiting = generation requests in flight - requests producing tokens (the engine counts those)."""

    def __init__(self, engine: AsyncEngine, max_queued: int) -> None:
        self.engine = engine
        self.max_queued = max_queued
        self.in_flight = 0
        self.draining = False
        self.rejected = Counter[str]()
        self._start_rate = 0.0  # requests per second that got their first token, smoothed
        self._last_sample: tuple[float, int] | None = None

    @property
    def num_waiting(self) -> int:
        return max(0, self.in_flight - self.engine.num_generating)

    def sample_start_rate(self) -> None:
        """Called periodically: updates the rate at which waiting requests start generating."""
        now, started = time.monotonic(), self.engine.num_started
        if self._last_sample is not None and now > self._last_sample[0]:
            rate = (started - self._last_sample[1]) / (now - self._last_sample[0])
            self._start_rate += _RATE_SMOOTHING * (rate - self._start_rate)
        self._last_sample = (now, started)

    def retry_after(self) -> int:
        """Seconds until the queue has room again at the recent start rate."""
        if self._start_rate <= 0:
            return _MIN_RETRY_S
        seconds = math.ceil((self.num_waiting - self.max_queued + 1) / self._start_rate)
        return min(_MAX_RETRY_S, max(_MIN_RETRY_S, seconds))

    def refusal(self, path: str) -> OpenAIError | None:
        """Why a new request on `path` is refused now, if it is."""
        if self.draining and path not in _DRAIN_EXEMPT:
            self.rejected["draining"] += 1
            return shutting_down()
        if path in GENERATION_PATHS and self.num_waiting >= self.max_queued:
            self.rejected["queue_full"] += 1
            retry = self.retry_after()
            return OpenAIError(429, f"the server is overloaded: {self.num_waiting} requests are waiting (at most "
                                    f"{self.max_queued}); retry in {retry} s",
                               headers={"Retry-After": str(retry)})
        return None


class AdmissionGuard:
    """ASGI middleware applying `Admission`, the API key on /v1 routes and the body size limit."""

    def __init__(self, app: ASGIApp, admission: Admission, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.admission = admission
        self.api_key = api_key.encode() if api_key else None
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        path = scope["path"]
        error = None
        declared = headers.get(b"content-length", b"0")
        if self.api_key is not None and path.startswith("/v1") and not self._authorized(headers):
            error = OpenAIError(401, "Incorrect or missing API key; send it as 'Authorization: Bearer <key>'.")
        elif not declared.isdigit() or int(declared) > self.max_body_bytes:
            self.admission.rejected["too_large"] += 1
            error = request_too_large(self.max_body_bytes)
        else:
            error = self.admission.refusal(path)
        if error is not None:
            await error.response()(scope, receive, send)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    self.admission.rejected["too_large"] += 1
                    raise request_too_large(self.max_body_bytes)
            return message

        counted = path in GENERATION_PATHS
        if counted:
            self.admission.in_flight += 1
        try:
            await self.app(scope, limited_receive, send)
        finally:
            if counted:
                self.admission.in_flight -= 1

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(key.strip(), self.api_key or b"")
