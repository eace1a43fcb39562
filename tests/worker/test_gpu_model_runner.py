"""On the GPU (Triton attention, CUDA graphs, bf16), the small test model's greedy and seeded tokens match the
CPU torch backend's."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch

from wick import LLM, SamplingParams
from wick.kernels import pdl

SMALL_VOCAB = 512  # the vocabulary of the small_model_dir fixture

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(2, SMALL_VOCAB) for _ in range(n)] for n in (5, 17, 33, 64, 100, 3, 48, 9)]


def _gpu_llm(folder: str, dtype: str, enforce_eager: bool) -> LLM:
    llm = LLM(folder, device="cuda", dtype=dtype, attention_backend="triton", enforce_eager=enforce_eager,
              max_num_seqs=16, kv_cache_memory=1 << 30)
    assert (llm.core.executor.worker.runner.step_graphs is None) == enforce_eager
    return llm


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_fp32_gpu_greedy_equals_cpu_torch_backend(small_model_dir, enforce_eager):
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    cpu = LLM(small_model_dir, device="cpu", dtype="float32", attention_backend="torch")
    expected = [o.outputs[0].token_ids for o in cpu.generate(_prompts(), params)]
    gpu = _gpu_llm(small_model_dir, "float32", enforce_eager)
    assert [o.outputs[0].token_ids for o in gpu.generate(_prompts(), params)] == expected


def test_large_decode_graphs_greedy_equal_cpu_torch_backend(small_model_dir):
    """Decode graphs of LARGE_DECODE rows and more, whose attention takes the requests longest context first."""
    rng = random.Random(1)
    prompts = [[rng.randrange(2, SMALL_VOCAB) for _ in range(rng.randrange(1, 200))] for _ in range(80)]
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    cpu = LLM(small_model_dir, device="cpu", dtype="float32", attention_backend="torch")
    expected = [o.outputs[0].token_ids for o in cpu.generate(prompts, params)]
    gpu = LLM(small_model_dir, device="cuda", dtype="float32", attention_backend="triton", max_num_seqs=96,
              kv_cache_memory=1 << 30)
    assert [o.outputs[0].token_ids for o in gpu.generate(prompts, params)] == expected


def test_late_release_greedy_equals_cpu_torch_backend(small_model_dir, monkeypatch):
    """Small kernels releasing their successor after their wait (kernels/pdl.py), as models of a hidden size of
    2,048 and more run them, in the decode graphs."""
    monkeypatch.setattr(pdl, "_release_early", pdl._release_early)  # put back after the test
    monkeypatch.setattr(pdl, "RELEASE_EARLY_BELOW_HIDDEN", 0)
    params = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    cpu = LLM(small_model_dir, device="cpu", dtype="float32", attention_backend="torch")
    expected = [o.outputs[0].token_ids for o in cpu.generate(_prompts(), params)]
    gpu = _gpu_llm(small_model_dir, "float32", enforce_eager=False)
    assert pdl.pdl_options(torch.empty(1, device="cuda"))["PDL"] == (2 if pdl.uses_pdl(torch.empty(1, device="cuda"))
                                                                      else 0)
    assert [o.outputs[0].token_ids for o in gpu.generate(_prompts(), params)] == expected


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_fp32_gpu_seeded_sampling_equals_cpu_torch_backend(small_model_dir, enforce_eager):
    """Seeded random rows drawn inside the decode graphs (or by the eager kernel), beside greedy rows and rows
    whose top-p sends the step to the eager sampler, draw the CPU sampler's tokens."""
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=24, ignore_eos=True) for i in range(4)]
    params += [SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True),
               SamplingParams(temperature=1.2, seed=9, max_tokens=24, ignore_eos=True)] * 2
    cpu = LLM(small_model_dir, device="cpu", dtype="float32", attention_backend="torch")
    gpu = _gpu_llm(small_model_dir, "float32", enforce_eager)
    for top_p in (1.0, 0.9):
        last = dataclasses.replace(params[-1], top_p=top_p)
        step_params = params[:-1] + [last]
        expected = [o.outputs[0].token_ids for o in cpu.generate(_prompts(), step_params)]
        assert [o.outputs[0].token_ids for o in gpu.generate(_prompts(), step_params)] == expected


@pytest.mark.parametrize("enforce_eager", [False, True])
def test_bf16_gpu_greedy_follows_torch_backend(small_model_dir, enforce_eager):
    """bf16 rounding flips close calls differently in each attention backend, so the reference is the
    torch backend in bf16: tokens are identical up to a divergence, and there the GPU path's choice is
    among the reference's top 5 (vLLM's check_logprobs_close); teacher-forced logprobs stay close."""
    torch_backend = LLM(small_model_dir, device="cuda", dtype="bfloat16", attention_backend="torch",
                        enforce_eager=True, kv_cache_memory=1 << 30)
    reference = torch_backend.generate(_prompts(), SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True,
                                                                  logprobs=5))
    gpu = _gpu_llm(small_model_dir, "bfloat16", enforce_eager)
    outputs = gpu.generate(_prompts(), SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True))
    for ref, out in zip(reference, outputs, strict=True):
        expected, got = ref.outputs[0].token_ids, out.outputs[0].token_ids
        if got != expected:
            i = next(i for i, (a, b) in enumerate(zip(expected, got, strict=True)) if a != b)
            assert got[i] in ref.outputs[0].logprobs[i], f"prompt {ref.request_id}: token {i} not in the top 5"
    sequences = [{"prompt_token_ids": r.prompt_token_ids + r.outputs[0].token_ids} for r in reference]
    scored = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    for a, b in zip(torch_backend.generate(sequences, scored), gpu.generate(sequences, scored), strict=True):
        for token_id, x, y in zip(a.prompt_token_ids[1:], a.prompt_logprobs[1:], b.prompt_logprobs[1:], strict=True):
            assert abs(x[token_id].logprob - y[token_id].logprob) < 0.5 + 0.05 * abs(x[token_id].logprob)


def test_lone_prompts_prefill_in_graphs_as_cpu_torch_backend(small_model_dir, monkeypatch):
    """Prompts one at a time, so each prefill step runs in a prefill graph: a 100-token prompt's last chunk over its
    first chunk's cache, a repeated prompt's over its cached prefix. Greedy and seeded tokens are the CPU's, prompt
    logprobs (from the graph's hidden states) close to them."""
    prompts = _prompts() + [_prompts()[3]]
    cpu = LLM(small_model_dir, device="cpu", dtype="float32", attention_backend="torch")
    gpu = LLM(small_model_dir, device="cuda", dtype="float32", attention_backend="triton", max_num_seqs=16,
              max_num_batched_tokens=64, kv_cache_memory=1 << 30)
    graphs = gpu.core.executor.worker.runner.step_graphs
    assert graphs.prefill_sizes == [16, 32, 64]
    shapes = []
    replay = graphs.run
    monkeypatch.setattr(graphs, "run", lambda step: shapes.append((step.input_ids.numel(), step.num_reqs))
                        or replay(step))
    params = [SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True),
              SamplingParams(temperature=0.9, seed=5, max_tokens=8, ignore_eos=True),
              SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True, prompt_logprobs=1)]
    block_size, seen = gpu.config.block_size, set()
    for prompt in prompts:
        for p in params:
            shapes.clear()
            expected, got = cpu.generate([prompt], p)[0], gpu.generate([prompt], p)[0]
            assert got.outputs[0].token_ids == expected.outputs[0].token_ids
            hit = tuple(prompt) in seen and p.prompt_logprobs is None
            new = len(prompt) - ((len(prompt) - 1) // block_size * block_size if hit else 0)
            last_chunk = new - (new - 1) // 64 * 64
            assert [t for t, b in shapes if t > b] == ([graphs.prefill_size(last_chunk)] if last_chunk > 1 else [])
            seen.add(tuple(prompt))
            if p.prompt_logprobs is not None:
                for token_id, x, y in zip(prompt[1:], expected.prompt_logprobs[1:], got.prompt_logprobs[1:],
                                          strict=True):
                    assert abs(x[token_id].logprob - y[token_id].logprob) < 1e-3


@pytest.mark.parametrize("quantization", ["q4_k", "q8_0", "fp8"])
def test_quantized_prefill_graphs_follow_eager(small_model_dir, quantization):
    """Weights quantized at load run a lone prompt's prefill in a graph (at the padded token count their layers may
    take other kernels than eagerly): prompt logprobs stay close to the eager engine's (the bf16 test's bound)."""
    engines = [LLM(small_model_dir, device="cuda", dtype="bfloat16", attention_backend="triton", max_num_seqs=4,
                   quantization=quantization, enforce_eager=eager, kv_cache_memory=1 << 28) for eager in (True, False)]
    graphs = engines[1].core.executor.worker.runner.step_graphs
    shapes = []
    replay = graphs.run
    graphs.run = lambda step: shapes.append(step.input_ids.numel()) or replay(step)
    scored = SamplingParams(temperature=0.0, max_tokens=1, prompt_logprobs=0)
    for prompt in _prompts()[:5]:
        eager, graphed = (llm.generate([prompt], scored)[0] for llm in engines)
        assert shapes[-1] == graphs.prefill_size(len(prompt))
        for token_id, x, y in zip(prompt[1:], eager.prompt_logprobs[1:], graphed.prompt_logprobs[1:], strict=True):
            assert abs(x[token_id].logprob - y[token_id].logprob) < 0.5 + 0.05 * abs(x[token_id].logprob)


def test_prefill_graph_longer_than_the_context(small_model_dir):
    """With max_model_len 100 the last prefill graph (128 tokens) is captured with 100 of them a request's, and runs
    a 97-token prompt: tokens as the CPU's."""
    prompt = [random.Random(1).randrange(2, SMALL_VOCAB) for _ in range(97)]
    params = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True)
    cpu = LLM(small_model_dir, device="cpu", dtype="float32", attention_backend="torch", max_model_len=100)
    gpu = LLM(small_model_dir, device="cuda", dtype="float32", attention_backend="triton", max_model_len=100,
              max_num_seqs=1, kv_cache_memory=1 << 28)
    assert gpu.core.executor.worker.runner.step_graphs.prefill_sizes[-1] == 128
    expected = cpu.generate([prompt], params)[0].outputs[0].token_ids
    assert gpu.generate([prompt], params)[0].outputs[0].token_ids == expected
