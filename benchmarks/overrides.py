"""`--set MODULE.NAME=VALUE`: a kernel's tuning constant replaced for one benchmark process, so that a tile shape a
kernel sweep found can be timed end to end without editing the tree, e.g.

    python -m benchmarks.quantized decode --model llama-3.1-8b --formats fp8 \\
        --set wick.kernels.fp8_matmul.FP8_GEMV_CONFIG=2,2048,2

The constant must be read through its module at call time (as the GEMVs read their configs) and the engine must
run in this process (tensor parallelism's workers would not see it)."""

from __future__ import annotations

import argparse
import importlib


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE", dest="overrides",
                        help="replace a tuning constant of wick's kernels (an int, a float or a tuple of ints: "
                             "2,2048,2) for this run; repeatable")


def apply_overrides(overrides: list[str], tensor_parallel_size: int = 1) -> None:
    """Sets each MODULE.NAME=VALUE, VALUE parsed as the constant's current type; a one-line error names what is
    wrong."""
    if overrides and tensor_parallel_size > 1:
        raise SystemExit("--set reaches this process only, not tensor parallelism's workers: run it with TP=1")
    for item in overrides:
        target, sep, text = item.partition("=")
        module_name, _, name = target.rpartition(".")
        if not sep or not module_name or not name:
            raise SystemExit(f"--set {item!r}: expected MODULE.NAME=VALUE")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise SystemExit(f"--set {item!r}: {error}") from None
        if not hasattr(module, name):
            raise SystemExit(f"--set {item!r}: {module_name} has no {name}")
        current = getattr(module, name)
        if not isinstance(current, (tuple, int, float)) or isinstance(current, bool):
            raise SystemExit(f"--set {item!r}: {name} is a {type(current).__name__}, not a number or a tuple")
        try:
            value = _parsed(text, current)
        except ValueError as error:
            raise SystemExit(f"--set {item!r}: {error}") from None
        setattr(module, name, value)
        print(f"set {target} = {value!r} (was {current!r})")


def _parsed(text: str, current: tuple | int | float) -> tuple | int | float:
    """text as a value of current's type (a tuple of as many ints)."""
    if not isinstance(current, tuple):
        return type(current)(text)
    value = tuple(int(v) for v in text.split(","))
    if len(value) != len(current):
        raise ValueError(f"{len(current)} values expected")
    return value
