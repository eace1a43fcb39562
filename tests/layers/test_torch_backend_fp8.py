"""The torch reference backend over an fp8 KV cache equals attention over float pages holding the same
e4m3 values; the engine holds four times the fp32 tokens in the same memory; bad kv-cache dtypes refused."""

from __future__ import annotations

import pytest
import torch

from wick import LLM, SamplingParams
from wick.config import EngineArgs
from wick.layers.attention.metadata import AttentionMetadata
from wick.layers.attention.torch_backend import TorchAttentionBackend

FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize(("window", "soft_cap"), [(None, None), (2, 1.0)])
def test_torch_backend_reads_scaled_fp8_pages(window: int | None, soft_cap: float | None) -> None:
    torch.manual_seed(0)
    q, k, v = torch.randn(7, 4, 16), torch.randn(7, 2, 16) * 3, torch.randn(7, 2, 16)
    metadata = AttentionMetadata(
        slot_mapping=torch.tensor([5, 6, 7, 8, 1, 2, 3]), query_start_loc=torch.tensor([0, 4, 7], dtype=torch.int32),
        seq_lens=torch.tensor([4, 3], dtype=torch.int32),
        block_tables=torch.tensor([[1, 2], [0, 3]], dtype=torch.int32),
        max_query_len=4, max_seq_len=4, query_start_loc_cpu=[0, 4, 7], seq_lens_cpu=[4, 3])
    backend = TorchAttentionBackend()
    fp8_caches = [torch.zeros(4, 4, 2, 16, dtype=FP8) for _ in range(2)]
    out = backend.forward(q, k, v, *fp8_caches, metadata, 0.25, sliding_window=window, logits_soft_cap=soft_cap,
                          k_scale=0.5, v_scale=0.125)
    # The same values in float pages: what the fp8 pages hold, times their scales.
    k_seen = (k / 0.5).to(FP8).float() * 0.5
    v_seen = (v / 0.125).to(FP8).float() * 0.125
    expected = backend.forward(q, k_seen, v_seen, torch.zeros(4, 4, 2, 16), torch.zeros(4, 4, 2, 16), metadata, 0.25,
                               sliding_window=window, logits_soft_cap=soft_cap)
    torch.testing.assert_close(out, expected)
    assert not torch.equal(k_seen, k)


def test_fp8_cache_holds_four_times_the_fp32_tokens(tiny_llama_dir: str) -> None:
    common = dict(kv_cache_memory=1 << 20, max_model_len=256, max_num_seqs=64, device="cpu")
    plain, fp8 = LLM(tiny_llama_dir, **common), LLM(tiny_llama_dir, kv_cache_dtype="fp8", **common)
    assert fp8.core.executor.worker.runner.num_blocks == 4 * plain.core.executor.worker.runner.num_blocks
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = fp8.generate(["Hello, my name is"], params)[0].outputs[0]
    assert len(out.token_ids) == 8
    assert fp8.core.executor.worker.runner.attention_layers[0].k_cache.dtype == FP8


def test_bad_kv_cache_dtype() -> None:
    with pytest.raises(ValueError, match="kv_cache_dtype must be auto or one of fp8, fp8_e4m3"):
        EngineArgs(kv_cache_dtype="int4")
