"""The engine's promises: a request's output does not depend on how it was scheduled."""

from __future__ import annotations

import random

import pytest

from wick import LLM, SamplingParams

PROMPT_LENGTHS = [3, 17, 40, 5, 64, 33, 9, 21, 48, 12, 70, 2, 15, 31, 56, 8]


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(0)
    return [[rng.randrange(100, 40000) for _ in range(n)] for n in PROMPT_LENGTHS]


def _generate(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list[int]]:
    return [out.outputs[0].token_ids for out in llm.generate(prompts, params)]


def _assert_no_leak(llm: LLM) -> None:
    manager = llm.core.kv_cache_manager
    assert not llm.core.has_unfinished_requests()
    assert manager.num_free_blocks == manager.num_blocks


GREEDY = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
SEEDED = SamplingParams(temperature=0.9, top_p=0.9, seed=1234, max_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def reference(tiny_llama_dir: str, prompts: list[list[int]]) -> dict[str, list[list[int]]]:
    """Each request run alone, one at a time, no prefix caching."""
    llm = LLM(tiny_llama_dir, enable_prefix_caching=False)
    return {name: [_generate(llm, [p], params)[0] for p in prompts]
            for name, params in (("greedy", GREEDY), ("seeded", SEEDED))}


@pytest.mark.parametrize("name,params", [("greedy", GREEDY), ("seeded", SEEDED)])
@pytest.mark.parametrize("overlap", [False, True])
def test_batch_of_16_matches_alone(tiny_llama_dir, prompts, reference, name, params, overlap):
    llm = LLM(tiny_llama_dir, enable_prefix_caching=False, async_scheduling=overlap)
    assert _generate(llm, prompts, params) == reference[name]
    _assert_no_leak(llm)


@pytest.mark.parametrize("name,params", [("greedy", GREEDY), ("seeded", SEEDED)])
@pytest.mark.parametrize("overlap", [False, True])
def test_chunked_prefill_matches_alone(tiny_llama_dir, prompts, reference, name, params, overlap):
    llm = LLM(tiny_llama_dir, max_num_batched_tokens=16, enable_prefix_caching=False, async_scheduling=overlap)
    assert _generate(llm, prompts, params) == reference[name]
    _assert_no_leak(llm)


def test_prefix_cache_hit_matches_alone(tiny_llama_dir, prompts, reference):
    llm = LLM(tiny_llama_dir, block_size=4)
    first = _generate(llm, prompts, GREEDY)
    again = llm.generate(prompts, GREEDY)
    assert first == reference["greedy"]
    assert [o.outputs[0].token_ids for o in again] == reference["greedy"]
    assert sum(o.num_cached_tokens for o in again) > 0
    assert llm.core.kv_cache_manager.prefix_cache_hits > 0
    _assert_no_leak(llm)


@pytest.mark.parametrize("name,params", [("greedy", GREEDY), ("seeded", SEEDED)])
@pytest.mark.parametrize("overlap", [False, True])
def test_preemption_matches_alone(tiny_llama_dir, prompts, reference, name, params, overlap):
    # 24 blocks of 4 tokens: the longest request needs 24 blocks alone, so a batch must preempt.
    llm = LLM(tiny_llama_dir, block_size=4, num_kv_blocks=24, async_scheduling=overlap)
    assert _generate(llm, prompts, params) == reference[name]
    assert llm.core.scheduler.num_preemptions > 0
    _assert_no_leak(llm)


def test_overlap_changes_no_output(tiny_llama_dir, prompts):
    """Stops, logprobs, prompt logprobs, n > 1, min_tokens and penalties (which make the engine wait for
    each token) give the same outputs with overlapped scheduling as without."""
    params = [SamplingParams(temperature=0.8 if i % 2 else 0.0, seed=i, max_tokens=10 + i,
                             min_tokens=3 if i % 3 == 0 else 0, logprobs=2 if i % 4 == 0 else None,
                             prompt_logprobs=1 if i % 5 == 0 else None, n=2 if i % 7 == 0 else 1,
                             presence_penalty=0.5 if i == 6 else 0.0)
              for i in range(len(prompts))]
    probe = LLM(tiny_llama_dir, async_scheduling=False).generate(prompts, params)
    # Each request stops at what would have been its sixth token: a stop one step before the engine knows it.
    params = [p.clone(stop_token_ids=[out.outputs[0].token_ids[5]]) for p, out in zip(params, probe, strict=True)]
    results = {}
    for overlap in (False, True):
        llm = LLM(tiny_llama_dir, block_size=4, num_kv_blocks=40, async_scheduling=overlap)
        outs = llm.generate(prompts, params)
        results[overlap] = [(out.prompt_logprobs, [(o.token_ids, o.logprobs, o.finish_reason, o.stop_reason)
                                                   for o in out.outputs]) for out in outs]
        _assert_no_leak(llm)
    assert results[True] == results[False]
    assert sum(o[2] == "stop" for _, outs in results[True] for o in outs) >= len(prompts) // 2


def test_n_samples_share_prompt_blocks(tiny_llama_dir, prompts):
    llm = LLM(tiny_llama_dir, block_size=4)
    prompt = prompts[10]
    out = llm.generate([prompt], SamplingParams(n=4, temperature=1.0, seed=7, max_tokens=8, ignore_eos=True))[0]
    assert len(out.outputs) == 4
    assert len({tuple(o.token_ids) for o in out.outputs}) > 1
    # Samples 1..3 waited for sample 0's prefill and found its full prompt blocks in the cache.
    assert llm.core.kv_cache_manager.prefix_cache_hits >= 3 * (len(prompt) // 4) * 4
    _assert_no_leak(llm)


def test_impossible_prompt_is_refused_at_once(tiny_llama_dir):
    llm = LLM(tiny_llama_dir, max_model_len=64)
    with pytest.raises(ValueError, match="64"):
        llm.generate([[5] * 64], GREEDY)
    small = LLM(tiny_llama_dir, block_size=4, num_kv_blocks=8)
    with pytest.raises(ValueError, match="cache"):
        small.generate([[5] * 40], GREEDY)
    _assert_no_leak(small)
