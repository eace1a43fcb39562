"""CPU prefill and decode speed of wick against llama.cpp (llama-cpp-python) on the same GGUF file, in one run.

For each prompt length: the time to prefill a prompt of random token ids (seed 0; the prefix cache off, so every
run computes the whole prompt), and greedy decode tokens per second over `--decode-tokens` tokens after it
(EOS ignored). Both engines use the same number of threads (torch's). Prints each figure and wick / llama.cpp.

    pip install llama-cpp-python
    python -m benchmarks.cpu                                   # the default model (SmolLM2-135M-Instruct Q4_1)
    python -m benchmarks.cpu --model /path/model.gguf --prompt-lens 256 1024 2048 --decode-tokens 128
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass

import torch

# Issue 16's targets: wick's decode >= 0.5x llama.cpp's, its prefill at 2k tokens >= 0.3x.
DECODE_TARGET, PREFILL_TARGET = 0.5, 0.3


@dataclass
class Figures:
    prefill_s: float
    decode_tokens_per_s: float


def prompt_ids(length: int, vocab_size: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(100, vocab_size - 100) for _ in range(length)]


def run_wick(model: str | None, prompts: list[list[int]], decode_tokens: int, max_model_len: int) -> list[Figures]:
    from wick import LLM, SamplingParams

    llm = LLM(model, max_model_len=max_model_len, enable_prefix_caching=False, device="cpu")
    one = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
    many = SamplingParams(max_tokens=decode_tokens + 1, temperature=0.0, ignore_eos=True)
    llm.generate({"prompt_token_ids": prompts[0][:32]}, one)  # warm-up
    results = []
    for ids in prompts:
        start = time.perf_counter()
        llm.generate({"prompt_token_ids": ids}, one)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        llm.generate({"prompt_token_ids": ids}, many)
        decode = time.perf_counter() - start - prefill
        results.append(Figures(prefill, decode_tokens / decode))
    return results


def run_llama_cpp(path: str, prompts: list[list[int]], decode_tokens: int, max_model_len: int) -> list[Figures]:
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_ctx=max_model_len, n_batch=max(len(p) for p in prompts),
                n_threads=torch.get_num_threads(), verbose=False)
    vocab_size = llm.n_vocab()

    def next_token() -> int:
        # Only the last position has logits (llama-cpp-python keeps no copy of them without logits_all).
        return int(np.argmax(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(vocab_size,))))

    llm.eval(prompts[0][:32])  # warm-up
    results = []
    for ids in prompts:
        llm.reset()
        start = time.perf_counter()
        llm.eval(ids)
        prefill = time.perf_counter() - start
        token = next_token()
        start = time.perf_counter()
        for _ in range(decode_tokens):
            llm.eval([token])
            token = next_token()
        results.append(Figures(prefill, decode_tokens / (time.perf_counter() - start)))
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a .gguf file (default: the default model's)")
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--skip-llama-cpp", action="store_true")
    args = parser.parse_args()

    from wick.loader.model_source import default_model_path, resolve_model

    path = args.model or default_model_path()
    vocab_size = resolve_model(path).config.vocab_size
    prompts = [prompt_ids(n, vocab_size) for n in args.prompt_lens]
    max_model_len = max(args.prompt_lens) + args.decode_tokens + 16
    print(f"model {path}; {torch.get_num_threads()} threads; torch {torch.__version__}", flush=True)
    wick = run_wick(path, prompts, args.decode_tokens, max_model_len)
    peer = None if args.skip_llama_cpp else run_llama_cpp(path, prompts, args.decode_tokens, max_model_len)
    print("| prompt tokens | wick prefill s | llama.cpp prefill s | ratio | wick decode tok/s | "
          "llama.cpp decode tok/s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for n, ours, theirs in zip(args.prompt_lens, wick, peer or [None] * len(wick), strict=True):
        if theirs is None:
            print(f"| {n} | {ours.prefill_s:.3f} | - | - | {ours.decode_tokens_per_s:.1f} | - | - |")
            continue
        prefill_ratio = theirs.prefill_s / ours.prefill_s
        decode_ratio = ours.decode_tokens_per_s / theirs.decode_tokens_per_s
        print(f"| {n} | {ours.prefill_s:.3f} | {theirs.prefill_s:.3f} | {prefill_ratio:.2f}x | "
              f"{ours.decode_tokens_per_s:.1f} | {theirs.decode_tokens_per_s:.1f} | {decode_ratio:.2f}x |")
    if peer is not None:
        print(f"targets: decode >= {DECODE_TARGET}x llama.cpp's, prefill at 2k tokens >= {PREFILL_TARGET}x "
              "(ratio = wick speed / llama.cpp speed)")


if __name__ == "__main__":
    main()
