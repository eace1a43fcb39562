"""The engine on a real GGUF file against transformers' own GGUF loading of the same file."""

from __future__ import annotations

import os

import pytest
import torch
from transformers import AutoModelForCausalLM

from wick import LLM, SamplingParams

PROMPTS = ["The quick brown fox jumps over the lazy dog because", "def fibonacci(n):\n    if n"]


@pytest.fixture(scope="module")
def hf_smollm2(smollm2_gguf):
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(smollm2_gguf),
                                                gguf_file=os.path.basename(smollm2_gguf),
                                                dtype=torch.float32).eval()


def test_smollm2_logprobs_and_greedy_tokens_match_transformers(smollm2_gguf, hf_smollm2, monkeypatch):
    # transformers computes in float32: so does wick's dequantizing path (the bfloat16 CPU kernels are held to it
    # in tests/layers/quantization/test_gguf_cpu.py).
    monkeypatch.setenv("WICK_CPU_QUANT_KERNELS", "0")
    llm = LLM(smollm2_gguf, max_model_len=512)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, prompt_logprobs=5)
    for out in llm.generate(PROMPTS, params):
        ids = torch.tensor([out.prompt_token_ids])
        with torch.no_grad():
            expected = hf_smollm2.generate(ids, max_new_tokens=16, do_sample=False, min_new_tokens=16)[0]
            logprobs = torch.log_softmax(hf_smollm2(ids).logits[0].float(), dim=-1)
        assert out.outputs[0].token_ids == expected[ids.shape[1]:].tolist()
        for position, entry in enumerate(out.prompt_logprobs[1:]):
            assert len(entry) >= 5
            for token_id, lp in entry.items():
                assert abs(lp.logprob - logprobs[position, token_id].item()) < 2e-3
