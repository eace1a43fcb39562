"""The K/V page writer against its pure-torch reference."""

from __future__ import annotations

import pytest
import torch

from wick.kernels.kv_cache_write import kv_cache_write, kv_cache_write_ref

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def check_write(num_tokens: int, num_kv_heads: int, head_dim: int, block_size: int, num_blocks: int,
                dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    # k and v as views into one fused projection output, as the models produce them
    kv = torch.randn(num_tokens, 2 * num_kv_heads * head_dim + 8, dtype=dtype, device=DEVICE)
    k = kv[:, : num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    v = kv[:, num_kv_heads * head_dim : 2 * num_kv_heads * head_dim].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    slots[::3] = -1
    k_cache = torch.randn(num_blocks, block_size, num_kv_heads, head_dim, dtype=dtype, device=DEVICE)
    v_cache = torch.randn_like(k_cache)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    kv_cache_write_ref(k, v, expected_k, expected_v, slots)
    kv_cache_write(k, v, k_cache, v_cache, slots)
    torch.testing.assert_close(k_cache, expected_k, atol=0, rtol=0)
    torch.testing.assert_close(v_cache, expected_v, atol=0, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("num_kv_heads", [1, 2, 3])
def test_matches_reference(dtype: torch.dtype, num_kv_heads: int) -> None:
    check_write(num_tokens=10, num_kv_heads=num_kv_heads, head_dim=16, block_size=4, num_blocks=8, dtype=dtype)


def test_no_tokens() -> None:
    k = torch.empty(0, 2, 16, device=DEVICE)
    cache = torch.zeros(4, 4, 2, 16, device=DEVICE)
    kv_cache_write(k, k, cache, cache, torch.empty(0, dtype=torch.int64, device=DEVICE))
    assert not cache.any()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_matches_reference_bf16_cuda() -> None:
    check_write(num_tokens=2000, num_kv_heads=8, head_dim=128, block_size=16, num_blocks=256, dtype=torch.bfloat16)
