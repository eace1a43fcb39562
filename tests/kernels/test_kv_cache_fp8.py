"""An fp8 (e4m3) KV cache: the Triton page writer and paged attention (also with a sliding window and soft-capped
logits) against their torch references."""

from __future__ import annotations

import pytest
import torch

from wick.kernels.kv_cache_write import kv_cache_write, kv_cache_write_ref
from wick.kernels.paged_attention import paged_attention
from wick.kernels.paged_attention_ref import paged_attention_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FP8 = torch.float8_e4m3fn


@pytest.mark.parametrize("scale", [1.0, 0.25])
def test_write_matches_reference(scale: float) -> None:
    torch.manual_seed(0)
    k = torch.randn(12, 2, 32, device=DEVICE) * 3
    k[1, 0, 0] = 1000.0  # saturates at 448 * scale
    v = torch.randn(12, 2, 32, device=DEVICE)
    slots = torch.randperm(64, device=DEVICE)[:12]
    slots[::4] = -1
    caches = [torch.zeros(8, 8, 2, 32, dtype=FP8, device=DEVICE) for _ in range(4)]
    kv_cache_write(k, v, caches[0], caches[1], slots, scale, 2 * scale)
    kv_cache_write_ref(k, v, caches[2], caches[3], slots, scale, 2 * scale)
    for ours, reference in ((caches[0], caches[2]), (caches[1], caches[3])):
        same = (ours.view(torch.uint8) == reference.view(torch.uint8)).float().mean().item()
        # Triton's interpreter rounds a few float32 -> e4m3 conversions otherwise than torch (and the GPU).
        assert same == 1.0 if torch.cuda.is_available() else same > 0.99
    assert caches[0].view(-1, 2, 32)[slots[1], 0].float().abs().max() <= 448


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("window", "soft_cap"), [(None, None), (6, 2.0)])
def test_attention_over_fp8_pages(dtype: torch.dtype, window: int | None, soft_cap: float | None) -> None:
    torch.manual_seed(1)
    num_blocks, block_size, kv_heads, head_dim = 16, 4, 2, 32
    k_cache = (torch.randn(num_blocks, block_size, kv_heads, head_dim) * 4).to(FP8).to(DEVICE)
    v_cache = (torch.randn(num_blocks, block_size, kv_heads, head_dim) * 4).to(FP8).to(DEVICE)
    query_start = torch.tensor([0, 1, 6], dtype=torch.int32, device=DEVICE)
    seq_lens = torch.tensor([13, 9], dtype=torch.int32, device=DEVICE)
    tables = torch.randperm(num_blocks, device=DEVICE)[:8].reshape(2, 4).to(torch.int32)
    q = torch.randn(6, 4, head_dim, device=DEVICE).to(dtype)
    out = paged_attention(q, k_cache, v_cache, query_start, seq_lens, tables, 0.2, 5, 13, k_scale=0.5, v_scale=0.25,
                          sliding_window=window, logits_soft_cap=soft_cap)
    expected = paged_attention_ref(q, k_cache, v_cache, query_start, seq_lens, tables, 0.2, sliding_window=window,
                                   logits_soft_cap=soft_cap, k_scale=0.5, v_scale=0.25)
    tolerance = 1e-5 if dtype == torch.float32 else 2e-3
    torch.testing.assert_close(out.float(), expected.float(), atol=tolerance, rtol=tolerance)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_attention_over_fp8_pages_bf16_split() -> None:
    torch.manual_seed(2)
    k_cache = torch.randn(1024, 16, 8, 128, device=DEVICE).to(FP8)
    v_cache = torch.randn(1024, 16, 8, 128, device=DEVICE).to(FP8)
    q = torch.randn(4, 32, 128, device=DEVICE, dtype=torch.bfloat16)
    query_start = torch.arange(5, dtype=torch.int32, device=DEVICE)
    seq_lens = torch.tensor([2000, 17, 1024, 3000], dtype=torch.int32, device=DEVICE)
    tables = torch.randperm(1024, device=DEVICE)[:4 * 188].reshape(4, 188).to(torch.int32)
    out = paged_attention(q, k_cache, v_cache, query_start, seq_lens, tables, 0.088, 1, 3000, k_scale=2.0)
    expected = paged_attention_ref(q, k_cache, v_cache, query_start, seq_lens, tables, 0.088, k_scale=2.0)
    torch.testing.assert_close(out.float(), expected.float(), atol=2e-2, rtol=2e-2)
