"""`wick serve`: the OpenAI-compatible HTTP server.

Exit codes: 0 after Ctrl-C / SIGTERM (once the running requests are done or stopped), 1 when the engine
core failed to start or died while serving, 2 for bad flags, a missing model or a port that cannot be
had, 128 + the signal's number when a second signal cut the drain short."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Coroutine
from typing import Any

from wick.cli.engine_flags import add_engine_flags, engine_args_from
from wick.config import EngineArgs
from wick.entrypoints.openai.load_limits import LoadLimits
from wick.tools.registry import REASONING_PARSERS, TOOL_PARSERS


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    add_engine_flags(parser, positional_model=True)
    frontend = parser.add_argument_group("frontend")
    frontend.add_argument("--host", default="127.0.0.1")
    frontend.add_argument("--port", "--p", type=int, default=8000)
    frontend.add_argument("--api-key", default=os.environ.get("WICK_API_KEY"),
                          help="require 'Authorization: Bearer KEY' on /v1 routes (default: $WICK_API_KEY)")
    frontend.add_argument("--served-model-name", nargs="+", default=None,
                          help="the model name(s) requests may use; the first stands for a request naming none")
    frontend.add_argument("--ui", "--ui-server", action="store_true",
                          help="also serve a chat page at / (the OpenAI API stays under /v1)")
    frontend.add_argument("--mcp-config", default=None, metavar="FILE",
                          help="a JSON file of MCP servers ({\"mcpServers\": {...}}) whose tools chat requests "
                               "without tools of their own may use; wick runs the calls")
    frontend.add_argument("--tool-call-parser", "--enforce-parser", choices=sorted(TOOL_PARSERS), default=None,
                          help="the model's tool-call format (default: the one its chat template implies, if any)")
    frontend.add_argument("--enable-auto-tool-choice", action="store_true",
                          help="accepted for vLLM's command lines: wick always takes tool_choice 'auto'")
    frontend.add_argument("--reasoning-parser", choices=sorted(REASONING_PARSERS), default=None,
                          help="split <think> reasoning into reasoning_content")
    frontend.add_argument("--disable-log-requests", "--no-enable-log-requests", action="store_true",
                          help="accepted for vLLM's command lines: wick logs no request contents")
    frontend.add_argument("--uvicorn-log-level", default="info",
                          choices=["critical", "error", "warning", "info", "debug", "trace"],
                          help="the HTTP server's log level (its access log is at info)")
    frontend.add_argument("--i", dest="interactive", action="store_true",
                          help="chat in the terminal instead of serving (vllm.rs); as `wick chat`")
    add_load_flags(parser)
    parser.set_defaults(run=run, system=None)


def add_load_flags(parser: argparse.ArgumentParser) -> None:
    """How much the server takes on (limits, admission, drain): LoadLimits."""
    defaults = LoadLimits()
    parser.add_argument("--max-request-body-bytes", type=int, default=defaults.max_body_bytes, metavar="BYTES",
                        help="larger bodies get 413, refused while reading (default: %(default)s)")
    parser.add_argument("--max-queued-requests", type=int, default=defaults.max_queued_requests, metavar="N",
                        help="generation requests that may wait for their first token; more get 429 with "
                             "Retry-After (default: %(default)s)")
    parser.add_argument("--shutdown-timeout", type=float, default=defaults.shutdown_timeout,
                        metavar="SECONDS",
                        help="on SIGTERM / Ctrl-C, how long running requests may take before they are stopped "
                             "(default: %(default)s)")


def run(args: argparse.Namespace) -> int:
    from wick.engine.async_engine import AsyncEngine
    from wick.engine.core_client import EngineStartupError
    from wick.entrypoints.openai.api_server import listen, serve
    from wick.mcp.config import load_mcp_config

    if args.interactive:
        from wick.cli import chat

        return chat.run(args)
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    limits = LoadLimits(args.max_request_body_bytes, args.max_queued_requests, args.shutdown_timeout)
    engine_args = engine_args_from(args)
    if engine_args.node_rank > 0 or _worker_rank_under_torchrun() > 0 or os.environ.get("SLURM_NODEID", "0") != "0":
        return _serve_workers(engine_args)
    mcp_servers = load_mcp_config(args.mcp_config) if args.mcp_config else None
    try:
        sock = listen(args.host, args.port)
    except OSError as e:
        raise ValueError(f"cannot listen on {args.host}:{args.port}: {e.strerror or e}") from e
    try:
        try:
            engine = AsyncEngine.from_engine_args(engine_args)
        except EngineStartupError as e:
            print(f"wick serve: error: {e}", file=sys.stderr)
            return 1
        try:
            return _run_event_loop(serve(engine, sock, served_model_names=args.served_model_name, api_key=args.api_key,
                                     chat_template=_chat_template(args.chat_template), webui=args.ui,
                                     mcp_servers=mcp_servers, tool_call_parser=args.tool_call_parser,
                                     reasoning_parser=args.reasoning_parser, limits=limits,
                                     uvicorn_log_level=args.uvicorn_log_level))
        finally:
            engine.shutdown()
    finally:
        sock.close()


def _chat_template(value: str | None) -> str | None:
    """--chat-template names a file, a template of the model's by name, or is the template itself."""
    if value is not None and os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    return value


def _worker_rank_under_torchrun() -> int:
    return int(os.environ.get("RANK", "0")) if "TORCHELASTIC_RUN_ID" in os.environ else 0


def _serve_workers(engine_args: EngineArgs) -> int:
    """A node other than 0 (or a rank other than 0 that torchrun started): workers only, no HTTP port;
    they exit when node 0 goes away."""
    from wick.executor.worker_process import run_worker, run_worker_node

    config = engine_args.create_engine_config()
    parallel = config.parallel
    print(f"wick serve: node {parallel.node_rank} of {parallel.nnodes}: workers for node 0 at "
          f"{parallel.master_addr}:{parallel.master_port}", file=sys.stderr)
    if parallel.launched_externally:
        run_worker(config, int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0")))
        return 0
    return run_worker_node(config)


def _run_event_loop(main: Coroutine[Any, Any, int]) -> int:
    """Runs the server on uvloop where it is installed (as vLLM does): with httptools it more than halves the
    front end's time per request (a burst of refusals: p99 time to a 429 317 -> 146 ms on a 2-core CPU)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    return uvloop.run(main)
