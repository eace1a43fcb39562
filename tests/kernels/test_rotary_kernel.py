"""The fused rotary kernel against its pure-torch reference and the RotaryEmbedding layer's torch path:
both round as the torch ops do, so they must agree bit for bit."""

from __future__ import annotations

import pytest
import torch

from wick.kernels.kv_cache_write import KVCacheTarget, kv_cache_write_ref
from wick.kernels.rms_norm import rms_norm_ref
from wick.kernels.rotary import rotary_embedding, rotary_embedding_ref
from wick.layers.norm import RMSNorm
from wick.layers.rotary import get_rope

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
MAX_POS = 1024
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 256}


def qk_views(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int,
             dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq * D] as a view into one qkv row (as the models produce it) and k [T, Hk, D] contiguous."""
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, device=DEVICE)
    q = qkv[:, : num_heads * head_dim]
    k = torch.randn(num_tokens, num_kv_heads, head_dim, dtype=dtype, device=DEVICE)
    return q, k


def check(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    rope = get_rope(head_dim, MAX_POS, 10000.0, YARN).to(DEVICE)
    positions = torch.randint(0, rope.cos_sin_cache.shape[0], (num_tokens,), device=DEVICE)
    q, k = qk_views(num_tokens, num_heads, num_kv_heads, head_dim, dtype)
    q_before, k_before = q.clone(), k.clone()
    out_q, out_k = rotary_embedding(positions, q, k, rope.cos_sin_cache)
    expected_q, expected_k = rotary_embedding_ref(positions, q, k, rope.cos_sin_cache)
    assert out_q.shape == q.shape and out_k.shape == k.shape and out_q.is_contiguous()
    torch.testing.assert_close(out_q, expected_q, atol=0, rtol=0)
    torch.testing.assert_close(out_k, expected_k, atol=0, rtol=0)
    assert torch.equal(q, q_before) and torch.equal(k, k_before)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 16), (3, 1, 24)])
def test_matches_reference(dtype: torch.dtype, num_heads: int, num_kv_heads: int, head_dim: int) -> None:
    check(num_tokens=5, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_matches_layer_torch_path(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    rope = get_rope(32, MAX_POS, 10000.0)
    positions = torch.tensor([0, 1, 7, 500, 1023])
    q, k = torch.randn(5, 4 * 32, dtype=dtype), torch.randn(5, 2, 32, dtype=dtype)
    expected_q, expected_k = rope(positions, q, k)
    out_q, out_k = rotary_embedding(positions.to(DEVICE), q.to(DEVICE), k.to(DEVICE), rope.cos_sin_cache.to(DEVICE))
    torch.testing.assert_close(out_q.cpu(), expected_q, atol=0, rtol=0)
    torch.testing.assert_close(out_k.cpu(), expected_k, atol=0, rtol=0)


def check_with_norms(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                     tolerance: float) -> None:
    """Each head RMS-normalized then rotated in one kernel against rms_norm_ref then rotary_embedding_ref."""
    torch.manual_seed(0)
    rope = get_rope(head_dim, MAX_POS, 10000.0).to(DEVICE)
    positions = torch.randint(0, MAX_POS, (num_tokens,), device=DEVICE)
    q, k = qk_views(num_tokens, num_heads, num_kv_heads, head_dim, dtype)
    q_weight, k_weight = (torch.rand(head_dim, dtype=dtype, device=DEVICE) + 0.5 for _ in range(2))
    out_q, out_k = rotary_embedding(positions, q, k, rope.cos_sin_cache, (q_weight, k_weight), eps=1e-6)
    normed_q = rms_norm_ref(q.view(num_tokens, num_heads, head_dim), q_weight, 1e-6)
    normed_k = rms_norm_ref(k, k_weight, 1e-6)
    expected_q, expected_k = rotary_embedding_ref(positions, normed_q, normed_k, rope.cos_sin_cache)
    assert out_q.shape == q.shape and out_k.shape == k.shape
    torch.testing.assert_close(out_q, expected_q.view(q.shape), atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(out_k, expected_k, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize(("dtype", "tolerance"), [(torch.float32, 1e-5), (torch.float16, 4e-3)])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 16), (3, 1, 24)])
def test_norms_then_rotation_match_reference(dtype: torch.dtype, tolerance: float, num_heads: int,
                                             num_kv_heads: int, head_dim: int) -> None:
    check_with_norms(5, num_heads, num_kv_heads, head_dim, dtype, tolerance)


def test_layer_with_norms_matches_norms_then_layer() -> None:
    """RotaryEmbedding given q/k norms (fused on CUDA, the norms' own forwards elsewhere) against the norms
    applied first."""
    torch.manual_seed(0)
    rope = get_rope(32, MAX_POS, 10000.0).to(DEVICE)
    norms = tuple(RMSNorm(32, eps=1e-5).to(DEVICE) for _ in range(2))
    for norm in norms:
        norm.weight.data.uniform_(0.5, 1.5)
    positions = torch.tensor([0, 3, 900], device=DEVICE)
    q, k = qk_views(3, 4, 2, 32, torch.float32)
    out_q, out_k = rope(positions, q, k, norms)
    expected_q, expected_k = rope(positions, norms[0](q.reshape(3, 4, 32)), norms[1](k))
    torch.testing.assert_close(out_q.reshape(3, 4, 32), expected_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out_k, expected_k, atol=1e-5, rtol=1e-5)


def check_cache_write(num_tokens: int, num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                      cache_dtype: torch.dtype, norms: bool = False) -> None:
    """Rotating with a cache target writes what kv_cache_write (the kernel it saves a launch of; its tests hold it to
    the torch reference) writes of the rotated k and of v, fp8 caches scaled and saturated, slots < 0 skipped; and
    returns what rotating alone returns."""
    torch.manual_seed(0)
    rope = get_rope(head_dim, MAX_POS, 10000.0).to(DEVICE)
    positions = torch.randint(0, MAX_POS, (num_tokens,), device=DEVICE)
    q, k = qk_views(num_tokens, num_heads, num_kv_heads, head_dim, dtype)
    v = torch.randn(num_tokens, num_kv_heads * head_dim, dtype=dtype, device=DEVICE) * 100
    weights = tuple(torch.rand(head_dim, dtype=dtype, device=DEVICE) + 0.5 for _ in range(2)) if norms else None
    num_blocks, block_size = 2 * num_tokens + 1, 4
    slots = torch.randperm(num_blocks * block_size, device=DEVICE)[:num_tokens]
    slots[::3] = -1
    caches = [torch.zeros(num_blocks, block_size, num_kv_heads, head_dim, dtype=cache_dtype, device=DEVICE)
              for _ in range(2)]
    expected_caches = [c.clone() for c in caches]
    target = KVCacheTarget(*caches, slots, k_scale=0.5, v_scale=0.25)
    out_q, out_k = rotary_embedding(positions, q, k, rope.cos_sin_cache, weights, 1e-6, v, target)
    expected_q, expected_k = rotary_embedding(positions, q, k, rope.cos_sin_cache, weights, 1e-6)
    torch.testing.assert_close(out_q, expected_q, atol=0, rtol=0)
    torch.testing.assert_close(out_k, expected_k, atol=0, rtol=0)
    KVCacheTarget(*expected_caches, slots, k_scale=0.5, v_scale=0.25).write(expected_k, v.view(k.shape))
    for written, expected in zip(caches, expected_caches, strict=True):
        assert torch.equal(written.view(torch.uint8), expected.view(torch.uint8))
    assert written.view(torch.uint8).any()


@pytest.mark.parametrize("cache_dtype", [torch.float16, torch.float8_e4m3fn])
@pytest.mark.parametrize(("num_heads", "num_kv_heads", "head_dim"), [(4, 2, 16), (3, 1, 32)])
def test_writes_the_cache_as_kv_cache_write(cache_dtype: torch.dtype, num_heads: int, num_kv_heads: int,
                                             head_dim: int) -> None:
    check_cache_write(7, num_heads, num_kv_heads, head_dim, torch.float16, cache_dtype, norms=head_dim == 16)


def test_layer_writes_the_cache_on_its_torch_path() -> None:
    """GPT-J-style RoPE has no kernel: the layer rotates in torch, then writes the cache target."""
    torch.manual_seed(0)
    rope = get_rope(16, MAX_POS, 10000.0, is_neox=False).to(DEVICE)
    positions = torch.tensor([0, 3, 900], device=DEVICE)
    q, k = qk_views(3, 4, 2, 16, torch.float32)
    v = torch.randn(3, 2 * 16, device=DEVICE)
    caches = [torch.zeros(3, 4, 2, 16, device=DEVICE) for _ in range(2)]
    slots = torch.tensor([5, -1, 0], device=DEVICE)
    out_q, out_k = rope(positions, q, k, v=v, cache=KVCacheTarget(*caches, slots))
    expected_q, expected_k = rope(positions, q, k)
    torch.testing.assert_close(out_q, expected_q, atol=0, rtol=0)
    torch.testing.assert_close(out_k, expected_k, atol=0, rtol=0)
    expected_caches = [torch.zeros_like(c) for c in caches]
    kv_cache_write_ref(expected_k, v.view(3, 2, 16), *expected_caches, slots)
    for written, expected in zip(caches, expected_caches, strict=True):
        torch.testing.assert_close(written, expected, atol=0, rtol=0)


def test_no_tokens() -> None:
    rope = get_rope(16, MAX_POS, 10000.0).to(DEVICE)
    empty = torch.empty(0, 32, device=DEVICE)
    out_q, out_k = rotary_embedding(torch.empty(0, dtype=torch.int64, device=DEVICE), empty, empty, rope.cos_sin_cache)
    assert out_q.shape == (0, 32) and out_k.shape == (0, 32)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("num_tokens", [1, 256, 8192])
def test_bf16_cuda(num_tokens: int) -> None:
    check(num_tokens, num_heads=16, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("num_tokens", [1, 4096])
def test_norms_bf16_cuda(num_tokens: int) -> None:
    """Qwen3's heads (16 q, 8 kv of 128) and Gemma 3's (256 dims) in bf16: within one rounding of bf16."""
    check_with_norms(num_tokens, 16, 8, 128, torch.bfloat16, 1.6e-2)
    check_with_norms(num_tokens, 16, 8, 256, torch.bfloat16, 1.6e-2)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("cache_dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_cache_write_bf16_cuda(cache_dtype: torch.dtype) -> None:
    """Llama's heads (32 q, 8 kv of 128) and Gemma 3's (16 q, 8 kv of 256, with q/k norms)."""
    check_cache_write(300, 32, 8, 128, torch.bfloat16, cache_dtype)
    check_cache_write(300, 16, 8, 256, torch.bfloat16, cache_dtype, norms=True)


@pytest.mark.gpu
@needs_cuda
def test_layer_dispatches_and_captures_in_cuda_graph() -> None:
    torch.manual_seed(0)
    rope = get_rope(128, MAX_POS, 1000000.0).to(DEVICE)
    positions = torch.randint(0, MAX_POS, (8,), device=DEVICE)
    q, k = qk_views(8, 16, 8, 128, torch.bfloat16)
    rope(positions, q, k)  # compiles the kernel outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out_q, out_k = rope(positions, q, k)
    positions.random_(0, MAX_POS)
    q.normal_()
    graph.replay()
    expected_q, expected_k = rotary_embedding_ref(positions, q, k, rope.cos_sin_cache)
    torch.testing.assert_close(out_q, expected_q, atol=0, rtol=0)
    torch.testing.assert_close(out_k, expected_k, atol=0, rtol=0)
