"""The new families through the whole engine (safetensors folder, scheduler, paged KV cache): greedy tokens
equal HF transformers' with chunked prefill, under preemption, and again after prefix-cache hits."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_configs import hf_configs, hf_model, word_tokenizer

from wick import LLM, SamplingParams

pytestmark = pytest.mark.slow

NEW_TOKENS = 12
# sliding windows of 8 keys (gemma2), routed and shared experts (qwen2_moe), Mixtral's checkpoint names,
# MLA's compressed cache (deepseek_v3), blocks released once out of every layer's window (mistral_window)
FAMILIES = ["gemma2", "qwen2_moe", "mixtral", "deepseek_v3", "mistral_window"]


@pytest.fixture(scope="module", params=FAMILIES)
def model_and_reference(request: pytest.FixtureRequest,
                        tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[list[int]], list[list[int]]]:
    folder = tmp_path_factory.mktemp(request.param)
    tokenizer = word_tokenizer(49152)  # the vocabulary size of the default model, whose tokenizer this was
    config = copy.deepcopy(hf_configs()[request.param])
    config.vocab_size = len(tokenizer)
    config.architectures = None
    hf = hf_model(config)
    hf.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(100, len(tokenizer), (n,), generator=g).tolist() for n in (5, 19, 30, 11)]
    with torch.no_grad():
        expected = [hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, do_sample=False)[0, len(p):].tolist()
                    for p in prompts]
    return str(folder), prompts, expected


def test_engine_matches_hf_chunked_preempted_and_cached(
        model_and_reference: tuple[str, list[list[int]], list[list[int]]]) -> None:
    folder, prompts, expected = model_and_reference
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    # 14 blocks of 4 tokens cannot hold the four requests at once; 8-token chunks split every long prompt
    llm = LLM(folder, block_size=4, num_kv_blocks=14, max_num_batched_tokens=8, max_num_seqs=4)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
    if llm.core.kv_cache_manager.sliding_window is None:
        assert llm.core.scheduler.num_preemptions > 0
    else:  # every layer slides over 8 keys: each request holds at most 4 blocks, so all fit at once
        assert llm.core.scheduler.num_preemptions == 0
    again = llm.generate(prompts[1:3], params)
    assert [o.outputs[0].token_ids for o in again] == expected[1:3]
    if llm.core.kv_cache_manager.sliding_window is None:  # released window blocks were reused meanwhile
        assert llm.core.kv_cache_manager.prefix_cache_hits > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_engine_on_cuda_matches_hf(model_and_reference: tuple[str, list[list[int]], list[list[int]]]) -> None:
    """fp32 on the GPU: the fused MoE kernel, the Triton attention kernel's windows and soft-cap, CUDA graphs; then
    each prompt alone, its prefill in a prefill graph (over a cached prefix for the longer two)."""
    folder, prompts, expected = model_and_reference
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True)
    # A small KV cache: every family's engine of this module shares the GPU with the ones before it.
    llm = LLM(folder, device="cuda", dtype="float32", attention_backend="triton", block_size=16, max_num_seqs=4,
              kv_cache_memory=256 * 2**20)
    assert [o.outputs[0].token_ids for o in llm.generate(prompts, params)] == expected
    assert [llm.generate([p], params)[0].outputs[0].token_ids for p in prompts] == expected
