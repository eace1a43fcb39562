"""Quantized weights and KV cache against bf16, in the same run (dummy weights of a preset's shapes).

decode: one request, 128 prompt tokens, 512 output tokens; tokens/s per format, the ratio to bf16 and the
share of the roofline of the bytes each format reads per step (weights as held + KV) at the measured copy
bandwidth. throughput: the 256-request workload of benchmarks/throughput.py per format and KV-cache
dtype (`--kv-cache-memory` sets a budget where bf16 must preempt). prefill: one prompt of 8,192 tokens.
"""

from __future__ import annotations

import argparse
import gc
import time

import numpy as np
import torch

from benchmarks.common import copy_bandwidth, kv_bytes_per_token, print_environment, weight_bytes
from benchmarks.overrides import add_set_argument, apply_overrides
from benchmarks.throughput import workload
from wick import LLM, SamplingParams


def _timed(llm: LLM, prompts: list, params: list | SamplingParams, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        llm.generate(prompts, params)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def decode(llm: LLM, args: argparse.Namespace, bandwidth: float) -> tuple[float, str]:
    prompt = np.random.default_rng(0).integers(0, llm.config.hf_config.vocab_size, args.input_len).tolist()
    llm.generate([prompt], SamplingParams(max_tokens=16, ignore_eos=True))
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    rate = args.output_len / _timed(llm, [prompt], params, args.repeats)
    model = llm.core.executor.worker.runner.model
    step_bytes = weight_bytes(model) + kv_bytes_per_token(model) * (args.input_len + args.output_len / 2)
    roof = bandwidth / step_bytes
    return rate, f"{step_bytes / 1e9:.2f} GB/step, roofline {roof:,.0f} tok/s, reached {rate / roof:.0%}"


def throughput(llm: LLM, args: argparse.Namespace, bandwidth: float) -> tuple[float, str]:
    prompts, output_lens = workload(args.num_requests, 100, 1024, llm.config.hf_config.vocab_size, 0)
    params = [SamplingParams(temperature=0.6, max_tokens=o, ignore_eos=True, seed=i) for i, o in enumerate(output_lens)]
    llm.generate(prompts[:8], [SamplingParams(max_tokens=16, ignore_eos=True)] * 8)
    elapsed = _timed(llm, prompts, params, 1)
    return sum(output_lens) / elapsed, f"{llm.core.executor.worker.runner.num_blocks} KV blocks"


def prefill(llm: LLM, args: argparse.Namespace, bandwidth: float) -> tuple[float, str]:
    prompt = np.random.default_rng(0).integers(0, llm.config.hf_config.vocab_size, args.prompt_len).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=1)
    llm.generate([prompt], params)
    return args.prompt_len / _timed(llm, [prompt], params, args.repeats), "prompt tokens/s"


def engine_kwargs(args: argparse.Namespace) -> dict:
    if args.mode == "decode":
        return dict(max_model_len=args.input_len + args.output_len + 16, max_num_seqs=16)
    if args.mode == "prefill":
        return dict(max_model_len=args.prompt_len + 16, max_num_seqs=8, max_num_batched_tokens=args.prompt_len,
                    enable_prefix_caching=False)
    return dict(max_model_len=4096, max_num_seqs=256, kv_cache_memory=args.kv_cache_memory)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("mode", choices=["decode", "throughput", "prefill"])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--formats", default="none,q4_k,gptq,fp8",
                        help="comma-separated --quantization values; none is the model dtype (bf16)")
    parser.add_argument("--kv-cache-dtypes", default="auto", help="comma-separated, e.g. auto,fp8")
    parser.add_argument("--kv-cache-memory", type=int, default=None, help="bytes of KV cache (throughput)")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=512)
    parser.add_argument("--prompt-len", type=int, default=8192)
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    add_set_argument(parser)
    args = parser.parse_args()
    apply_overrides(args.overrides)
    print_environment()
    bandwidth = copy_bandwidth()
    print(f"copy bandwidth: {bandwidth / 1e12:.2f} TB/s")
    run = {"decode": decode, "throughput": throughput, "prefill": prefill}[args.mode]
    baseline = None
    for kv_dtype in args.kv_cache_dtypes.split(","):
        for fmt in args.formats.split(","):
            llm = LLM(args.model, load_format="dummy", quantization=None if fmt == "none" else fmt,
                      kv_cache_dtype=kv_dtype, attention_backend=args.attention_backend,
                      async_scheduling=args.async_scheduling, **engine_kwargs(args))
            rate, detail = run(llm, args, bandwidth)
            baseline = baseline or rate
            label = f"{fmt if fmt != 'none' else 'bf16'} / kv {kv_dtype}"
            print(f"{args.mode} {args.model} {label:>20}: {rate:10,.1f} tok/s  {rate / baseline:5.2f}x  {detail}")
            del llm
            gc.collect()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
