"""The start-up warm-up's eager steps: which shapes, that they run the real model without writing the KV cache,
and, on a GPU, that a served mix of steps compiles no attention kernel after it."""

from __future__ import annotations

import random

import pytest
import torch

from wick import LLM, SamplingParams
from wick.config import EngineArgs
from wick.worker.model_runner import ModelRunner
from wick.worker.warm_up import QUERY_LENS, SPLIT_CONTEXT, warm_up_eager_steps, warm_up_shapes


def test_every_query_length_meets_a_short_and_a_full_context_within_the_limits():
    shapes = warm_up_shapes(4096, 8192, 256)
    assert len(shapes) == len(set(shapes))
    for q in QUERY_LENS:
        assert (1, q, q) in shapes and (1, q, 4096) in shapes
    assert all(b * q <= 8192 and b <= 256 and q <= c <= 4096 for b, q, c in shapes)
    assert {(b, q) for b, q, c in shapes if c == 4096 and b > 1} >= {(32, 128), (32, 1)}
    contexts = {c for b, q, c in shapes if b == 1 and q in (1, 2)}
    assert contexts >= {SPLIT_CONTEXT * 2**k for k in range(5)}


def test_small_limits_bound_the_shapes():
    shapes = warm_up_shapes(64, 32, 2)
    assert max(q for _, q, _ in shapes) == 32
    assert all(b * q <= 32 and b <= 2 and c <= 64 for b, q, c in shapes)
    assert (2, 16, 64) in shapes and (2, 32, 64) not in shapes


def test_the_steps_run_the_model_and_leave_the_kv_cache_as_it_was(tiny_llama_dir: str):
    config = EngineArgs(model=tiny_llama_dir, max_model_len=256, max_num_seqs=8, device="cpu",
                        attention_backend="torch").create_engine_config()
    runner = ModelRunner(config)
    runner.initialize_kv_cache(24)  # fewer pages than a full context: tables wrap around the cache
    caches = [c for layer in runner.attention_layers for c in (layer.k_cache, layer.v_cache)]
    for cache in caches:
        cache.normal_()
    before = [cache.clone() for cache in caches]
    calls = []
    forward = runner.model.forward
    runner.model.forward = lambda ids, positions: calls.append((ids.numel(), positions.max().item())) or forward(
        ids, positions)
    shapes = warm_up_shapes(256, 64, 8)
    warm_up_eager_steps(runner.model, runner.backend, shapes, runner.block_size, runner.num_blocks, runner.device)
    assert calls == [(b * q, c - 1) for b, q, c in shapes]
    assert all(torch.equal(a, b) for a, b in zip(caches, before, strict=True))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_served_steps_compile_no_attention_kernel_after_the_warm_up(small_model_dir: str,
                                                                   monkeypatch: pytest.MonkeyPatch):
    from triton.runtime.jit import JITFunction

    llm = LLM(small_model_dir, device="cuda", attention_backend="triton", max_num_seqs=16, max_model_len=1024,
              max_num_batched_tokens=96, kv_cache_memory=1 << 30)
    compiled = []
    do_compile = JITFunction._do_compile

    def counting(self, *args, **kwargs):
        compiled.append(self.fn.__name__)
        return do_compile(self, *args, **kwargs)

    monkeypatch.setattr(JITFunction, "_do_compile", counting)
    rng = random.Random(0)
    prompts = [[rng.randrange(2, 512) for _ in range(rng.randrange(1, 700))] for _ in range(24)]
    prompts += prompts[:8]  # prefix-cache hits: a prompt's last tokens only
    params = [SamplingParams(temperature=0.6, seed=i, max_tokens=rng.randrange(1, 40), ignore_eos=True)
              for i in range(len(prompts))]
    for i in range(0, len(prompts), 8):  # waves of requests: mixed steps of prefill chunks and decodes
        llm.generate(prompts[i:i + 8], params[i:i + 8])
    print("compiled after the warm-up:", compiled)
    assert not [name for name in compiled if "attention" in name or "combine" in name]
