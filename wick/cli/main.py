"""`wick <verb>`: one module per verb, each with add_parser(subparsers) and run(args)."""

from __future__ import annotations

import argparse
import logging
import sys
from typing import NoReturn

from wick.cli import chat, generate, serve


class _Parser(argparse.ArgumentParser):
    """Bad flags give one line on stderr (not the usage block) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="wick", description="Serve and run large language models.")
    subparsers = parser.add_subparsers(dest="verb", required=True)
    for verb in (generate, chat, serve):
        verb.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if getattr(args, "log", False):
        logging.getLogger("wick").setLevel(logging.DEBUG)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as e:
        message = " ".join(str(e).split())  # one line, whatever the message holds
        print(f"wick {args.verb}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
