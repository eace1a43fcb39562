"""The engine core in its own process: receives requests over ZMQ, steps, sends outputs back.

Wire format: every message is one msgpack-encoded list whose first item names its kind.

front end -> core:
    ["add", request_id, prompt_token_ids, sampling_params (dict of fields), seed, prefill_leader,
     pooling_params (dict of fields, or None for a generation request)]
    ["abort", [request_id, ...]]
    ["shutdown"]
core -> front end:
    ["ready", {"max_model_len", "num_kv_blocks", "block_size", "vocab_size"}]
    ["outputs", [encoded EngineCoreOutput, ...], stats]   (an embedding comes as its list of floats)
    ["error", request_id, message]     a request the core refused (ValueError from add_request)
    ["fatal", message]                 the core failed; the process exits non-zero right after
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
from typing import Any

import msgpack
import zmq

from wick.config import EngineArgs
from wick.engine.core import EngineCore
from wick.engine.protocol import EngineCoreOutput, EngineCoreRequest
from wick.pooling_params import PoolingParams
from wick.sampling_params import SamplingParams

logger = logging.getLogger(__name__)

# How long an idle core waits for a message before it looks again whether its parent is alive.
_IDLE_POLL_MS = 500
_OUTPUT_FIELDS = [f.name for f in dataclasses.fields(EngineCoreOutput)]
_PARAM_FIELDS = [f.name for f in dataclasses.fields(SamplingParams)]


def pack(message: list) -> bytes:
    return msgpack.packb(message, use_bin_type=True)


def unpack(data: bytes) -> list:
    # Integer map keys (logit_bias) need strict_map_key off.
    return msgpack.unpackb(data, raw=False, strict_map_key=False)


def encode_request(request: EngineCoreRequest) -> list:
    params = {name: getattr(request.sampling_params, name) for name in _PARAM_FIELDS}
    if params["structured_outputs"] is not None:
        params["structured_outputs"] = dataclasses.asdict(params["structured_outputs"])
    pooling = dataclasses.asdict(request.pooling_params) if request.pooling_params is not None else None
    return ["add", request.request_id, request.prompt_token_ids, params, request.seed, request.prefill_leader,
            pooling]


def decode_request(message: list) -> EngineCoreRequest:
    _, request_id, prompt_token_ids, params, seed, prefill_leader, pooling = message
    return EngineCoreRequest(request_id, prompt_token_ids, SamplingParams(**params), seed, prefill_leader,
                             PoolingParams(**pooling) if pooling is not None else None)


def encode_output(output: EngineCoreOutput) -> list:
    return [getattr(output, name) for name in _OUTPUT_FIELDS]


def decode_output(values: list) -> EngineCoreOutput:
    return EngineCoreOutput(*values)


def core_stats(core: EngineCore) -> dict[str, Any]:
    scheduler, kv = core.scheduler, core.kv_cache_manager
    return {
        "num_running": scheduler.num_running,
        "num_waiting": scheduler.num_waiting,
        "kv_cache_usage": kv.usage,
        "prefix_cache_queries": kv.prefix_cache_queries,
        "prefix_cache_hits": kv.prefix_cache_hits,
        "num_preemptions": scheduler.num_preemptions,
    }


def run_engine_core(engine_args: EngineArgs, input_address: str, output_address: str, parent_pid: int,
                    log_level: int = logging.INFO) -> None:
    """The core process's entry point (a multiprocessing spawn target)."""
    # Ctrl-C in a terminal reaches the whole process group: the front end decides when the core stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=log_level, format="%(levelname)s %(name)s [core]: %(message)s")
    context = zmq.Context()
    inbox = context.socket(zmq.PULL)
    inbox.connect(input_address)
    outbox = context.socket(zmq.PUSH)
    outbox.connect(output_address)
    exit_code = 0
    started = False
    core = None
    try:
        core = EngineCore(engine_args.create_engine_config())
        outbox.send(pack(["ready", {
            "max_model_len": core.config.max_model_len,
            "num_kv_blocks": core.kv_cache_manager.num_blocks,
            "block_size": core.kv_cache_manager.block_size,
            "vocab_size": core.vocab_size,
        }]))
        started = True
        _serve(core, inbox, outbox, parent_pid)
    except Exception as e:
        # A bad model name or setting is the user's to fix, and the front end shows the message.
        if started or not isinstance(e, ValueError | FileNotFoundError):
            logger.exception("the engine core failed")
        outbox.send(pack(["fatal", f"{type(e).__name__}: {e}"]))
        exit_code = 1
    finally:
        if core is not None:
            core.shutdown()
        # Linger so that a last fatal message still leaves before the sockets close.
        inbox.close(linger=0)
        outbox.close(linger=2000)
        context.term()
    # Everything that needs closing is closed: skip the interpreter's teardown of the model's objects,
    # which takes seconds on a small machine and would make an asked-for shutdown look like a hang.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(exit_code)


def _serve(core: EngineCore, inbox: zmq.Socket, outbox: zmq.Socket, parent_pid: int) -> None:
    poller = zmq.Poller()
    poller.register(inbox, zmq.POLLIN)
    while os.getppid() == parent_pid:
        busy = core.has_unfinished_requests()
        events = dict(poller.poll(0 if busy else _IDLE_POLL_MS))
        changed = False
        while events:
            message = unpack(inbox.recv())
            kind = message[0]
            if kind == "shutdown":
                return
            if kind == "add":
                request = decode_request(message)
                try:
                    core.add_request(request)
                except ValueError as e:
                    outbox.send(pack(["error", request.request_id, str(e)]))
            elif kind == "abort":
                core.abort_requests(message[1])
            else:
                raise ValueError(f"unknown message kind {kind!r}")
            changed = True
            events = dict(poller.poll(0))
        if core.has_unfinished_requests():
            outputs = core.step()
            outbox.send(pack(["outputs", [encode_output(o) for o in outputs], core_stats(core)]))
        elif changed:
            outbox.send(pack(["outputs", [], core_stats(core)]))
    logger.warning("the front end process is gone; the engine core exits")
