"""`wick serve`: the OpenAI-compatible HTTP server.

Exit codes: 0 after Ctrl-C / SIGTERM, 1 when the engine core failed to start or died while serving,
2 for bad flags, a missing model or a port that cannot be had."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from wick.cli.engine_flags import add_engine_flags, engine_args_from


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    add_engine_flags(parser)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", "--p", type=int, default=8000)
    parser.add_argument("--api-key", default=os.environ.get("WICK_API_KEY"),
                        help="require 'Authorization: Bearer KEY' on /v1 routes (default: $WICK_API_KEY)")
    parser.add_argument("--served-model-name", nargs="+", default=None,
                        help="the model name(s) requests may use; the first stands for a request naming none")
    parser.add_argument("--ui", "--ui-server", action="store_true",
                        help="also serve a chat page at / (the OpenAI API stays under /v1)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from wick.engine.async_engine import AsyncEngine
    from wick.engine.core_client import EngineStartupError
    from wick.entrypoints.openai.api_server import listen, serve

    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    engine_args = engine_args_from(args)
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
            died = asyncio.run(serve(engine, sock, served_model_names=args.served_model_name, api_key=args.api_key,
                                     chat_template=_chat_template(args.chat_template), webui=args.ui))
        finally:
            engine.shutdown()
    finally:
        sock.close()
    return 1 if died else 0


def _chat_template(value: str | None) -> str | None:
    """--chat-template names a file, a template of the model's by name, or is the template itself."""
    if value is not None and os.path.isfile(value):
        with open(value, encoding="utf-8") as f:
            return f.read()
    return value
