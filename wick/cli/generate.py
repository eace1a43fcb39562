"""`wick generate --prompt "..."`: print one completion."""

from __future__ import annotations

import argparse
import dataclasses

from wick.cli.engine_flags import add_engine_flags, engine_args_from
from wick.sampling_params import SamplingParams


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="complete one prompt and print the result")
    add_engine_flags(parser)
    parser.add_argument("--prompt", "-p", required=True)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from wick.entrypoints.llm import LLM

    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
                            top_k=args.top_k, seed=args.seed)
    llm = LLM(**dataclasses.asdict(engine_args_from(args)))
    if args.chat:
        output = llm.chat([{"role": "user", "content": args.prompt}], params)[0]
    else:
        output = llm.generate(args.prompt, params)[0]
    print(output.outputs[0].text)
    return 0
