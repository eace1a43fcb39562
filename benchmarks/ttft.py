"""Time to first token of one request alone: `LLM.generate` of a fresh prompt (no prefix-cache hit) with one output
token, the median and min over repeats for each prompt length; and the engine's start-up time, CUDA graphs
captured. benchmarks/prefill.py times one long prompt's throughput."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.common import print_environment
from wick import LLM, SamplingParams


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--input-lens", type=int, nargs="+", default=[16, 128, 512, 2048])
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    print_environment()

    start = time.perf_counter()
    llm = LLM(args.model, load_format=args.load_format, max_model_len=max(args.input_lens) + 16, max_num_seqs=16,
              attention_backend=args.attention_backend, enforce_eager=args.enforce_eager)
    print(f"start-up: {time.perf_counter() - start:.1f} s")
    vocab = llm.config.hf_config.vocab_size
    rng = np.random.default_rng(0)
    params = SamplingParams(temperature=0.0, max_tokens=1)
    print(f"{args.model}: one request alone, time to its first token (ms), {args.repeats} fresh prompts each")
    print("| prompt tokens | median | min |")
    print("|---|---|---|")
    for n in args.input_lens:
        times = []
        for i in range(args.repeats + 2):  # the first two compile what this length needs
            prompt = rng.integers(0, vocab, n).tolist()
            torch.cuda.synchronize()
            begin = time.perf_counter()
            llm.generate([prompt], params)
            torch.cuda.synchronize()
            if i >= 2:
                times.append((time.perf_counter() - begin) * 1e3)
        print(f"| {n} | {np.median(times):.2f} | {min(times):.2f} |")


if __name__ == "__main__":
    main()
