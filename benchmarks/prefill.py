"""Prefill: one long prompt (8,192 tokens by default) through the engine; achieved TFLOP/s against
the bf16 matmul peak measured in the same run."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.common import print_environment
from wick import LLM, SamplingParams


def matmul_peak(n: int = 8192, repeats: int = 20, trials: int = 5) -> float:
    """Best of several timed bursts of bf16 n^3 products (the clocks need a burst to ramp up)."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    best = 0.0
    for _ in range(trials):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(repeats):
            a @ b
        torch.cuda.synchronize()
        best = max(best, 2 * n**3 * repeats / (time.perf_counter() - start))
    return best


def prefill_flops(llm: LLM, num_tokens: int) -> float:
    """Matmul FLOPs of the linear layers plus causal attention (QK^T and PV over half the square)."""
    config = llm.config.hf_config
    model = llm.core.executor.worker.runner.model
    linear = sum(p.numel() for n, p in model.named_parameters() if n.endswith("proj.weight"))
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 2 * 2 * config.num_hidden_layers * config.num_attention_heads * head_dim * num_tokens**2 / 2
    return 2 * linear * num_tokens + attention + 2 * config.hidden_size * config.vocab_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--prompt-len", type=int, default=8192)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print_environment()
    llm = LLM(args.model, load_format=args.load_format, max_model_len=args.prompt_len + 16, max_num_seqs=8,
              max_num_batched_tokens=args.prompt_len, attention_backend=args.attention_backend,
              enable_prefix_caching=False)
    prompt = np.random.default_rng(0).integers(0, llm.config.hf_config.vocab_size, args.prompt_len).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([prompt], params)
    times = []
    for _ in range(args.repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate([prompt], params)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    elapsed = float(np.median(times))
    achieved = prefill_flops(llm, args.prompt_len) / elapsed
    peak = matmul_peak()
    print(f"wick prefill: {args.prompt_len} tokens in {elapsed * 1000:.1f} ms (median of {args.repeats}) = "
          f"{args.prompt_len / elapsed:,.0f} tokens/s, {achieved / 1e12:.0f} TFLOP/s")
    print(f"bf16 matmul peak (8192^3, same run): {peak / 1e12:.0f} TFLOP/s; reached {achieved / peak:.0%}")


if __name__ == "__main__":
    main()
