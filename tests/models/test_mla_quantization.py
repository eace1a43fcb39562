"""MLA (DeepSeek) with the quantization work: an fp8 compressed cache holds four times the fp32 tokens and
serves; quantized weights are refused in one clear error (MLA reads kv_b_proj as a float matrix)."""

from __future__ import annotations

import copy

import pytest
import torch
from hf_configs import hf_configs, hf_model
from transformers import PreTrainedTokenizerBase

from wick import LLM, SamplingParams


@pytest.fixture(scope="module")
def deepseek_dir(tmp_path_factory: pytest.TempPathFactory, smollm2_tokenizer: PreTrainedTokenizerBase) -> str:
    tokenizer = smollm2_tokenizer
    config = copy.deepcopy(hf_configs()["deepseek_v3"])
    config.vocab_size = len(tokenizer)
    config.architectures = None
    folder = tmp_path_factory.mktemp("deepseek_v3")
    hf_model(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def test_fp8_mla_cache(deepseek_dir: str) -> None:
    common = dict(kv_cache_memory=1 << 20, max_model_len=256, max_num_seqs=64, device="cpu")
    plain, fp8 = LLM(deepseek_dir, **common), LLM(deepseek_dir, kv_cache_dtype="fp8", **common)
    runner = fp8.core.executor.worker.runner
    assert 4 * runner.kv_bytes_per_block() == plain.core.executor.worker.runner.kv_bytes_per_block()
    assert runner.num_blocks == (1 << 20) // runner.kv_bytes_per_block()
    assert runner.attention_layers[0].kv_cache.dtype == torch.float8_e4m3fn
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    prompt = "The capital of France is"
    out = fp8.generate([prompt], params)[0].outputs[0]
    assert len(out.token_ids) == 6
    assert out.token_ids[0] == plain.generate([prompt], params)[0].outputs[0].token_ids[0]


def test_quantized_mla_weights_refused(deepseek_dir: str) -> None:
    with pytest.raises(ValueError, match="not supported for MLA"):
        LLM(deepseek_dir, quantization="fp8", device="cpu")
