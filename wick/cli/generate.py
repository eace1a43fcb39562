"""`wick generate --prompt "..."`: print one completion."""

from __future__ import annotations

import argparse
import dataclasses

from wick.cli.engine_flags import add_engine_flags, engine_args_from

# What `wick generate` writes at most when neither the flags nor the model's generation config say.
GENERATE_MAX_TOKENS = 256


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("generate", help="complete one prompt and print the result")
    add_engine_flags(parser)
    parser.add_argument("--prompt", "-p", required=True)
    parser.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Samples with the model's sampling defaults, under the flags' (--temperature, --max-tokens, ...)."""
    from wick.entrypoints.llm import LLM

    llm = LLM(**dataclasses.asdict(engine_args_from(args)))
    defaults = llm.sampling_defaults
    params = defaults.sampling_params(defaults.max_tokens or GENERATE_MAX_TOKENS, seed=args.seed)
    if args.chat:
        output = llm.chat([{"role": "user", "content": args.prompt}], params)[0]
    else:
        output = llm.generate(args.prompt, params)[0]
    print(output.outputs[0].text)
    return 0
