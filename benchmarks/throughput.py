"""Offline throughput: 256 requests, prompt and output lengths uniform in [100, 1024], random token ids,
seed 0, EOS ignored; output tokens per second. `--compare-hf` runs HF transformers' generate_batch on the
same GPU in the same run; `--json PATH` writes the figures (benchmarks/serve.py reads them). On a machine
without CUDA it runs on the CPU and skips the roofline."""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from benchmarks.common import copy_bandwidth, kv_bytes_per_token, print_environment, weight_bytes
from benchmarks.graph_gaps import GraphGaps
from benchmarks.overrides import add_set_argument, apply_overrides
from wick import LLM, SamplingParams


def workload(num_requests: int, min_len: int, max_len: int, vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    input_lens = rng.integers(min_len, max_len + 1, num_requests)
    output_lens = rng.integers(min_len, max_len + 1, num_requests)
    prompts = [rng.integers(0, vocab, n).tolist() for n in input_lens]
    return prompts, output_lens.tolist()


def roofline_seconds(llm: LLM, prompts: list[list[int]], output_lens: list[int], bandwidth: float) -> float:
    """Bytes that must move / copy bandwidth: the weights once per decode step of a schedule that runs
    every request at once (as many steps as the longest output), plus each decode step's KV reads."""
    model = llm.core.executor.worker.runner.model
    kv_per_token = kv_bytes_per_token(model)
    kv_read = sum(kv_per_token * (len(p) * o + o * (o - 1) // 2) for p, o in zip(prompts, output_lens, strict=True))
    steps = max(output_lens) * -(-len(prompts) // llm.config.max_num_seqs)
    # Copy bandwidth counts bytes read plus bytes written; a read-only stream moves bytes at that rate.
    return (weight_bytes(model, tokens=min(len(prompts), llm.config.max_num_seqs)) * steps + kv_read) / bandwidth


def run_hf(model_name: str, prompts: list[list[int]], output_lens: list[int]) -> float:
    from transformers import AutoModelForCausalLM, GenerationConfig

    from wick.loader.presets import get_preset_config

    config = get_preset_config(model_name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16,
                                             attn_implementation="paged|sdpa").cuda().eval()
    max_new = int(np.mean(output_lens))
    gen = GenerationConfig(max_new_tokens=max_new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    torch.cuda.synchronize()
    start = time.perf_counter()
    results = model.generate_batch(inputs=prompts, generation_config=gen)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    generated = sum(len(r.generated_tokens) for r in results.values())
    print(f"HF generate_batch (paged|sdpa, {max_new} new tokens each): {generated} tokens in {elapsed:.1f} s "
          f"= {generated / elapsed:,.0f} output tokens/s")
    del model
    torch.cuda.empty_cache()
    return generated / elapsed


def kernel_profiler() -> torch.profiler.profile:
    return torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])


def print_kernel_time(profiler: torch.profiler.profile, elapsed: float, rows: int = 25) -> None:
    """The GPU's busy time by kernel (and copy) name over the profiled run, largest first, against its wall time."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for event in profiler.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals[event.name]
            entry[0] += event.device_time_total
            entry[1] += 1
    busy = sum(t for t, _ in totals.values()) / 1e6
    print(f"GPU kernels and copies: {busy:.2f} s busy of {elapsed:.2f} s ({busy / elapsed:.0%}), {len(totals)} names")
    for name, (total, count) in sorted(totals.items(), key=lambda kv: -kv[1][0])[:rows]:
        print(f"  {total / 1e6:7.3f} s {total / 1e6 / busy:6.1%} {count:8d} calls {total / count:9.1f} us  {name[:90]}")


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """The model, workload and engine flags the throughput benchmarks share."""
    parser.add_argument("--model", default="qwen3-0.6b")
    parser.add_argument("--num-requests", "--num-prompts", type=int, default=256)
    parser.add_argument("--min-len", type=int, default=100)
    parser.add_argument("--max-len", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-num-seqs", type=int, default=256)
    parser.add_argument("--max-model-len", type=int, default=4096)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--temperature", type=float, default=0.6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    add_workload_args(parser)
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--max-num-batched-tokens", type=int, default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--compare-hf", action="store_true")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    parser.add_argument("--graph-gaps", action="store_true",
                        help="also time the GPU between decode graph replays with CUDA events (one GPU)")
    parser.add_argument("--json", type=Path, default=None, help="also write the figures to this file")
    parser.add_argument("--profile", action="store_true",
                        help="run the workload under the torch profiler (GPU only) and print the GPU's time by kernel; "
                             "the profiler slows the host, so that run's tokens/s is not the engine's")
    add_set_argument(parser)
    args = parser.parse_args()
    apply_overrides(args.overrides, args.tensor_parallel_size)
    if args.profile and not torch.cuda.is_available():
        parser.error("--profile times GPU kernels: it needs CUDA")
    if args.profile and args.json is not None:
        parser.error("--profile slows the run: its figures are not for --json")
    print_environment()

    llm = LLM(args.model, load_format=args.load_format, max_num_seqs=args.max_num_seqs,
              max_model_len=args.max_model_len, max_num_batched_tokens=args.max_num_batched_tokens,
              attention_backend=args.attention_backend, enforce_eager=args.enforce_eager, seed=args.seed,
              tensor_parallel_size=args.tensor_parallel_size, async_scheduling=args.async_scheduling)
    vocab = llm.config.hf_config.vocab_size
    prompts, output_lens = workload(args.num_requests, args.min_len, args.max_len, vocab, args.seed)
    params = [SamplingParams(temperature=args.temperature, max_tokens=o, ignore_eos=True, seed=i)
              for i, o in enumerate(output_lens)]
    warmup = prompts[:8]
    llm.generate(warmup, [SamplingParams(max_tokens=16, ignore_eos=True)] * len(warmup))

    gaps = GraphGaps() if args.graph_gaps else None
    if gaps is not None:
        gaps.install(llm.core.executor.worker.runner)
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    profiler = kernel_profiler() if args.profile else contextlib.nullcontext()
    sync()
    start = time.perf_counter()
    with profiler:
        outputs = llm.generate(prompts, params)
        sync()
        elapsed = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert generated == sum(output_lens)
    throughput = generated / elapsed
    print(f"wick (TP={args.tensor_parallel_size}): {args.num_requests} requests, {generated} output tokens "
          f"in {elapsed:.2f} s = "
          f"{throughput:,.0f} output tokens/s")
    if args.json is not None:
        input_tokens = sum(len(p) for p in prompts)
        args.json.write_text(json.dumps({
            "requests": args.num_requests, "input_tokens": input_tokens, "output_tokens": generated,
            "duration_s": elapsed, "output_throughput": throughput,
            "total_token_throughput": (input_tokens + generated) / elapsed}))
    if gaps is not None:
        gaps.report()
    if args.profile:
        print_kernel_time(profiler, elapsed)
    if torch.cuda.is_available():
        bandwidth = copy_bandwidth()
        bound = roofline_seconds(llm, prompts, output_lens, bandwidth)
        print(f"roofline: copy bandwidth {bandwidth / 1e12:.2f} TB/s, bytes that must move -> {bound:.2f} s = "
              f"{generated / bound:,.0f} tokens/s; reached {bound / elapsed:.0%}")
    if args.compare_hf:
        del llm
        torch.cuda.empty_cache()
        hf = run_hf(args.model, prompts, output_lens)
        print(f"wick / HF = {throughput / hf:.1f}x")


if __name__ == "__main__":
    main()
