"""One request: 128 prompt tokens, 512 output tokens; tokens per second and the share of the
memory-bandwidth roofline (weight bytes + KV bytes per step / measured copy bandwidth).
`--compare-hf` runs HF transformers' generate on the same GPU in the same run."""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from benchmarks.common import copy_bandwidth, kv_bytes_per_token, print_environment, weight_bytes
from benchmarks.overrides import add_set_argument, apply_overrides
from wick import LLM, SamplingParams


def run_hf(model_name: str, prompt: list[int], output_len: int) -> float:
    from transformers import AutoModelForCausalLM

    from wick.loader.presets import get_preset_config

    model = AutoModelForCausalLM.from_config(get_preset_config(model_name), dtype=torch.bfloat16,
                                             attn_implementation="sdpa").cuda().eval()
    ids = torch.tensor([prompt], device="cuda")
    kwargs = dict(max_new_tokens=output_len, min_new_tokens=output_len, do_sample=False, pad_token_id=0)
    model.generate(ids, **{**kwargs, "max_new_tokens": 8, "min_new_tokens": 8})
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, **kwargs)
    torch.cuda.synchronize()
    rate = output_len / (time.perf_counter() - start)
    print(f"HF generate (sdpa): {rate:,.0f} tokens/s")
    del model
    torch.cuda.empty_cache()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--load-format", default="dummy")
    parser.add_argument("--input-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=512)
    parser.add_argument("--attention-backend", default=None)
    parser.add_argument("--enforce-eager", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compare-hf", action="store_true")
    parser.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    add_set_argument(parser)
    args = parser.parse_args()
    apply_overrides(args.overrides, args.tensor_parallel_size)
    print_environment()

    llm = LLM(args.model, load_format=args.load_format, max_model_len=args.input_len + args.output_len + 16,
              max_num_seqs=16, attention_backend=args.attention_backend, enforce_eager=args.enforce_eager,
              tensor_parallel_size=args.tensor_parallel_size, async_scheduling=args.async_scheduling)
    vocab = llm.config.hf_config.vocab_size
    prompt = np.random.default_rng(0).integers(0, vocab, args.input_len).tolist()
    params = SamplingParams(temperature=0.0, max_tokens=args.output_len, ignore_eos=True)
    # warm-up: the timed request itself, so that every kernel it launches (the greedy sampler's too) is compiled
    llm.generate([prompt], params)
    times = []
    for _ in range(args.repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        out = llm.generate([prompt], params)[0].outputs[0]
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        assert len(out.token_ids) == args.output_len
    elapsed = float(np.median(times))
    rate = args.output_len / elapsed
    model = llm.core.executor.worker.runner.model
    bandwidth = copy_bandwidth()
    mean_context = args.input_len + args.output_len / 2
    step_bytes = weight_bytes(model) + kv_bytes_per_token(model) * mean_context
    roof = bandwidth / step_bytes
    print(f"wick (TP={args.tensor_parallel_size}): {args.output_len} tokens after a {args.input_len}-token prompt "
          f"in {elapsed:.3f} s "
          f"(median of {args.repeats}) = {rate:,.0f} tokens/s, including the prefill")
    # With tensor parallelism each GPU reads its own shard (rank 0's model) at its own bandwidth.
    print(f"roofline: {step_bytes / 1e9:.2f} GB per step and GPU at {bandwidth / 1e12:.2f} TB/s -> "
          f"{roof:,.0f} tokens/s; "
          f"reached {rate / roof:.0%}")
    if args.compare_hf:
        del llm
        torch.cuda.empty_cache()
        hf = run_hf(args.model, prompt, args.output_len)
        print(f"wick / HF = {rate / hf:.1f}x")


if __name__ == "__main__":
    main()
