"""Tensor parallelism on two GPUs (NCCL, CUDA graphs with the all-reduce inside): TP=2 follows TP=1 in
bf16 by the closeness rule of the single-GPU tests (identical tokens up to a divergence, where TP=2's
token is among TP=1's top 5)."""

from __future__ import annotations

import random

import pytest
import torch

from wick import LLM, SamplingParams

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]


def test_tp2_bf16_follows_tp1(small_model_dir: str) -> None:
    """With CUDA graphs (the all-reduce captured inside): the prompts together, then each alone (its prefill in a
    prefill graph). One tensor-parallel engine per process on GPUs."""
    rng = random.Random(0)
    prompts = [[rng.randrange(2, 512) for _ in range(n)] for n in (5, 17, 33, 64, 100, 3, 48, 9)]

    def run(tp: int, logprobs: int | None) -> list:
        llm = LLM(small_model_dir, device="cuda", dtype="bfloat16", attention_backend="triton",
                  max_num_seqs=16, kv_cache_memory=1 << 30, tensor_parallel_size=tp, enable_prefix_caching=False)
        try:
            assert llm.core.executor.worker.runner.step_graphs is not None
            params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=logprobs)
            together = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
            return together + [llm.generate([{"prompt_token_ids": p}], params)[0] for p in prompts]
        finally:
            llm.core.shutdown()

    reference = run(1, 5)
    for ref, out in zip(reference, run(2, None), strict=True):
        expected, got = ref.outputs[0].token_ids, out.outputs[0].token_ids
        if got != expected:
            i = next(i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b)
            assert got[i] in ref.outputs[0].logprobs[i], f"prompt {ref.request_id}: token {i} not in the top 5"
