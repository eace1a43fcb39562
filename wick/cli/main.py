"""`wick <verb>`: one module per verb, each with add_parser(subparsers) and run(args)."""

from __future__ import annotations

import argparse
import logging
import sys

from wick.cli import generate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="wick", description="Serve and run large language models.")
    subparsers = parser.add_subparsers(dest="verb", required=True)
    for verb in (generate,):
        verb.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"wick {args.verb}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
