"""The front end's handle on an engine core running in another process (see core_process.py).

CoreClient starts the process, waits until the model is loaded, sends requests and aborts, and
hands everything the core sends back to a callback from a background thread. It watches the
process itself too, so a core that is killed or crashes is noticed at once, not at the next
timeout.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zmq

from wick.config import EngineArgs
from wick.engine.core_process import decode_output, encode_request, pack, run_engine_core, unpack
from wick.engine.protocol import EngineCoreOutput, EngineCoreRequest, merge_step_outputs

logger = logging.getLogger(__name__)

_POLL_MS = 100
_SHUTDOWN_TIMEOUT_S = 5.0
# Messages read in one pass when the receiver fell behind the core (their steps' outputs are merged).
_MAX_CATCH_UP = 64


class EngineDeadError(RuntimeError):
    """The engine core process is gone: no request can be served any more."""


class EngineStartupError(RuntimeError):
    """The engine core process failed while loading the model."""


@dataclass
class CoreInfo:
    """What the core reports once its model is loaded."""

    max_model_len: int
    num_kv_blocks: int
    block_size: int
    vocab_size: int


@dataclass
class CoreOutputs:
    outputs: list[EngineCoreOutput]
    stats: dict[str, Any]


@dataclass
class RequestError:
    """The core refused a request (a ValueError from EngineCore.add_request)."""

    request_id: str
    message: str


@dataclass
class CoreDied:
    reason: str


CoreEvent = CoreOutputs | RequestError | CoreDied


class CoreClient:
    """Starts an EngineCore process for `engine_args` and blocks until its model is loaded.

    `on_event` is called from a background thread with each CoreOutputs / RequestError, and once
    with CoreDied when the core is gone (crashed, killed or shut down).
    """

    def __init__(self, engine_args: EngineArgs, on_event: Callable[[CoreEvent], None]) -> None:
        self._on_event = on_event
        self._send_lock = threading.Lock()
        self._death_lock = threading.Lock()
        self._closing = threading.Event()
        self.dead_reason: str | None = None
        self._socket_dir = tempfile.mkdtemp(prefix="wick-core-")
        input_address = f"ipc://{self._socket_dir}/input"
        output_address = f"ipc://{self._socket_dir}/output"
        self._context = zmq.Context()
        self._outbox = self._context.socket(zmq.PUSH)
        # Never block the caller: a send either queues or fails at once (no peer = the core is gone).
        self._outbox.setsockopt(zmq.SNDHWM, 0)
        self._outbox.bind(input_address)
        self._inbox = self._context.socket(zmq.PULL)
        self._inbox.bind(output_address)
        self.process = multiprocessing.get_context("spawn").Process(
            target=run_engine_core, name="wick-engine-core", daemon=True,
            args=(engine_args, input_address, output_address, os.getpid(), logging.getLogger().getEffectiveLevel()))
        self.process.start()
        try:
            self.info = self._wait_until_ready()
        except BaseException:
            self._stop_process(grace_s=0.0)
            self._close_sockets()
            raise
        self._receiver = threading.Thread(target=self._receive_loop, name="wick-core-client", daemon=True)
        self._receiver.start()

    @property
    def is_dead(self) -> bool:
        return self.dead_reason is not None

    def add_request(self, request: EngineCoreRequest) -> None:
        self._send(encode_request(request))

    def abort_requests(self, request_ids: list[str]) -> None:
        """Aborts in the core; does nothing once the core is gone (its requests are gone with it)."""
        if request_ids and not self.is_dead:
            try:
                self._send(["abort", request_ids])
            except EngineDeadError:
                pass

    def shutdown(self) -> None:
        """Stops the core process (asking first, then terminating) and releases the sockets."""
        if self._closing.is_set():
            return
        self._closing.set()
        if self.process.is_alive() and not self.is_dead:
            try:
                self._send(["shutdown"])
            except EngineDeadError:
                pass
        self._stop_process(grace_s=_SHUTDOWN_TIMEOUT_S)
        self._receiver.join()
        self._close_sockets()
        self._die("the engine was shut down", expected=True)

    def _send(self, message: list) -> None:
        if self.is_dead:
            raise EngineDeadError(self.dead_reason)
        with self._send_lock:
            try:
                self._outbox.send(pack(message), zmq.NOBLOCK)
            except zmq.Again as e:
                raise EngineDeadError("the engine core process is not reachable") from e

    def _wait_until_ready(self) -> CoreInfo:
        poller = zmq.Poller()
        poller.register(self._inbox, zmq.POLLIN)
        poller.register(self.process.sentinel, zmq.POLLIN)
        while True:
            events = dict(poller.poll(_POLL_MS))
            if self._inbox in events or self.process.sentinel in events:
                # A dying core sends its error just before it exits: read that first.
                if self._inbox.poll(_POLL_MS if self.process.sentinel in events else 0):
                    message = unpack(self._inbox.recv())
                    if message[0] == "ready":
                        return CoreInfo(**message[1])
                    if message[0] == "fatal":
                        raise EngineStartupError(f"the engine core failed to start: {message[1]}")
                    raise EngineStartupError(f"unexpected message from the engine core during start-up: {message[0]}")
                if not self.process.is_alive():
                    raise EngineStartupError(
                        f"the engine core process exited with code {self.process.exitcode} during start-up")

    def _receive_loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self._inbox, zmq.POLLIN)
        poller.register(self.process.sentinel, zmq.POLLIN)
        while not self._closing.is_set():
            events = dict(poller.poll(_POLL_MS))
            if self._inbox in events:
                steps: list[list] = []  # consecutive outputs messages, emitted as one
                for message in self._waiting_messages():
                    kind = message[0]
                    if kind == "outputs":
                        steps.append(message)
                        continue
                    self._emit_outputs(steps)
                    steps = []
                    if kind == "error":
                        self._emit(RequestError(message[1], message[2]))
                    elif kind == "fatal":
                        self.process.join(_SHUTDOWN_TIMEOUT_S)
                        self._die(f"the engine core failed: {message[1]}")
                        return
                self._emit_outputs(steps)
                # Drain every message before concluding from the sentinel that the core died.
                continue
            if self.process.sentinel in events and not self._closing.is_set():
                self.process.join()
                self._die(f"the engine core process died unexpectedly (exit code {self.process.exitcode})")
                return

    def _waiting_messages(self) -> list[list]:
        """The messages the inbox holds (one at least), oldest first: more than one when the core has run
        ahead of this thread."""
        messages = [unpack(self._inbox.recv())]
        while len(messages) < _MAX_CATCH_UP:
            try:
                messages.append(unpack(self._inbox.recv(zmq.NOBLOCK)))
            except zmq.Again:
                break
        return messages

    def _emit_outputs(self, steps: list[list]) -> None:
        """One CoreOutputs for consecutive steps' outputs messages: each request's tokens of all of them
        together, so that detokenizing and handing out cost one pass per request, not one per step."""
        if not steps:
            return
        if len(steps) == 1:
            outputs = [decode_output(o) for o in steps[0][1]]
        else:
            outputs = merge_step_outputs([[decode_output(o) for o in step[1]] for step in steps])
        self._emit(CoreOutputs(outputs, steps[-1][2]))

    def _emit(self, event: CoreEvent) -> None:
        try:
            self._on_event(event)
        except Exception:
            logger.exception("error while handling the engine core's %s", type(event).__name__)

    def _die(self, reason: str, expected: bool = False) -> None:
        with self._death_lock:
            if self.dead_reason is not None:
                return
            self.dead_reason = reason
        if not expected:
            logger.error("%s", reason)
        self._emit(CoreDied(reason))

    def _stop_process(self, grace_s: float) -> None:
        """Waits `grace_s` for the process to exit by itself, then terminates it, then kills it."""
        self.process.join(grace_s)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(_SHUTDOWN_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    def _close_sockets(self) -> None:
        self._outbox.close(linger=0)
        self._inbox.close(linger=0)
        self._context.term()
        shutil.rmtree(self._socket_dir, ignore_errors=True)
