"""Grammar backends on the CPU: xgrammar against llguidance.

For each tokenizer: the one-off tokenizer-info build, the compile time of a JSON schema (a fresh
compiler each time, so no cache helps), and the time to fill one row of the token bitmask while a
matcher walks through a valid JSON document, token by token.

    python -m benchmarks.structured_output --tokenizer smollm2=PATH.gguf --tokenizer qwen=PATH.gguf
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable

import torch

from wick.tokenizer.tokenizer import get_tokenizer

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "color": {"enum": ["red", "green", "blue"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city"]},
    },
    "required": ["name", "age", "color", "tags"],
}
DOCUMENT = json.dumps({"name": "Ada Lovelace", "age": 36, "color": "green", "tags": ["math", "engines", "poetry"],
                       "address": {"city": "London", "zip": "W1"}}, separators=(",", ":"))


def best_of(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_xgrammar(tokenizer, vocab_size: int, tokens: list[int], repeat: int) -> dict[str, float]:
    import xgrammar as xgr

    start = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
    info_s = time.perf_counter() - start
    compile_s = best_of(lambda: xgr.GrammarCompiler(info, cache_enabled=False).compile_json_schema(SCHEMA),
                        repeat)
    compiled = xgr.GrammarCompiler(info).compile_json_schema(SCHEMA)
    bitmask = xgr.allocate_token_bitmask(1, vocab_size)
    fills = []
    for _ in range(repeat):
        matcher = xgr.GrammarMatcher(compiled)
        for token in tokens:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask, 0)
            fills.append(time.perf_counter() - start)
            assert matcher.accept_token(token), "the document does not match the schema"
    return {"tokenizer_info_s": info_s, "compile_s": compile_s, "fill_mean_s": statistics.mean(fills),
            "fill_p99_s": statistics.quantiles(fills, n=100)[98]}


def bench_llguidance(tokenizer, vocab_size: int, tokens: list[int], repeat: int) -> dict[str, float]:
    import llguidance
    import llguidance.hf
    import llguidance.torch

    start = time.perf_counter()
    ll_tokenizer = llguidance.hf.from_tokenizer(tokenizer, vocab_size)
    info_s = time.perf_counter() - start
    grammar = llguidance.LLMatcher.grammar_from_json_schema(SCHEMA)

    def compile_once() -> None:
        # llguidance compiles lazily; the first mask is where the work happens.
        matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
        llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)

    bitmask = llguidance.torch.allocate_token_bitmask(1, vocab_size)
    compile_s = best_of(compile_once, repeat)
    fills = []
    for _ in range(repeat):
        matcher = llguidance.LLMatcher(ll_tokenizer, grammar)
        for token in tokens:
            start = time.perf_counter()
            llguidance.torch.fill_next_token_bitmask(matcher, bitmask, 0)
            fills.append(time.perf_counter() - start)
            assert matcher.consume_token(token), matcher.get_error()
    return {"tokenizer_info_s": info_s, "compile_s": compile_s, "fill_mean_s": statistics.mean(fills),
            "fill_p99_s": statistics.quantiles(fills, n=100)[98]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", action="append", required=True, metavar="NAME=PATH",
                        help="a tokenizer to load with wick's get_tokenizer (a GGUF file or a model folder/id)")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"Python {platform.python_version()}")
    for spec in args.tokenizer:
        name, path = spec.split("=", 1)
        tokenizer = get_tokenizer(path)
        tokens = tokenizer.encode(DOCUMENT, add_special_tokens=False)
        vocab_size = len(tokenizer)
        for backend, bench in (("xgrammar", bench_xgrammar), ("llguidance", bench_llguidance)):
            r = bench(tokenizer, vocab_size, tokens, args.repeat)
            print(f"{name:8s} vocab {vocab_size:>7,}  {backend:10s}"
                  f"  tokenizer info {r['tokenizer_info_s'] * 1e3:8.1f} ms"
                  f"  schema compile {r['compile_s'] * 1e3:7.2f} ms  mask fill mean {r['fill_mean_s'] * 1e6:7.1f} us"
                  f"  p99 {r['fill_p99_s'] * 1e6:7.1f} us  ({len(tokens)} tokens)")


if __name__ == "__main__":
    main()
