"""The reference paged attention backend against plain causal SDPA on unpaged tensors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from wick.layers.attention.metadata import AttentionMetadata
from wick.layers.attention.selector import get_attention_backend
from wick.layers.attention.torch_backend import TorchAttentionBackend

H, HKV, D, BLOCK, NUM_BLOCKS = 8, 2, 16, 4, 64


def causal_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """q, k, v [L, heads, D] of one whole sequence -> [L, H, D]."""
    k, v = (x.repeat_interleave(H // HKV, dim=1).transpose(0, 1) for x in (k, v))
    return F.scaled_dot_product_attention(q.transpose(0, 1), k, v, is_causal=True, scale=scale).transpose(0, 1)


def metadata_for(
    seq_lens: list[int], query_lens: list[int], tables: list[list[int]], pad_tokens: int = 0
) -> AttentionMetadata:
    """Each request's last query_len tokens are new; pad_tokens trailing tokens belong to no request."""
    slots, starts = [], [0]
    for seq_len, query_len, table in zip(seq_lens, query_lens, tables, strict=True):
        slots += [table[p // BLOCK] * BLOCK + p % BLOCK for p in range(seq_len - query_len, seq_len)]
        starts.append(starts[-1] + query_len)
    width = max(len(t) for t in tables)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots + [-1] * pad_tokens, dtype=torch.int64),
        query_start_loc=torch.tensor(starts, dtype=torch.int32),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        block_tables=torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
        query_start_loc_cpu=starts,
        seq_lens_cpu=seq_lens,
        block_tables_cpu=tables,
    )


@pytest.mark.parametrize("layout", ["contiguous", "allocated"])
@pytest.mark.parametrize("pages", ["scattered", "consecutive"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_prefill_chunk_and_decode_match_causal_sdpa(dtype: torch.dtype, pages: str, layout: str) -> None:
    """Scattered pages are gathered; a request's consecutive pages are read through one view of the cache;
    in a plain contiguous cache and in the head-major one the backend allocates."""
    torch.manual_seed(0)
    seq_lens, query_lens = [1, 9, 17, 30], [1, 9, 5, 1]  # prefill, prefill, chunk over cached context, decode
    free = torch.randperm(NUM_BLOCKS).tolist() if pages == "scattered" else list(range(NUM_BLOCKS))[::-1]
    tables = [[free.pop() for _ in range(-(-n // BLOCK))] for n in seq_lens]
    runs = metadata_for(seq_lens, query_lens, tables)
    firsts = [runs.first_of_consecutive_pages(i, len(t)) for i, t in enumerate(tables)]
    if pages == "consecutive":
        assert firsts == [t[0] for t in tables]
    else:
        assert firsts[3] is None  # 8 pages of 64 in random order
    seqs = [[torch.randn(n, heads, D, dtype=dtype) for heads in (H, HKV, HKV)] for n in seq_lens]
    backend, scale = TorchAttentionBackend(), D**-0.5
    if layout == "contiguous":
        k_cache, v_cache = (torch.zeros(NUM_BLOCKS, BLOCK, HKV, D, dtype=dtype) for _ in range(2))
    else:
        k_cache, v_cache = (backend.allocate_kv_cache((NUM_BLOCKS, BLOCK, HKV, D), dtype, torch.device("cpu"))
                            for _ in range(2))
        assert k_cache.shape == (NUM_BLOCKS, BLOCK, HKV, D) and k_cache.stride(2) == NUM_BLOCKS * BLOCK * D

    # the cached context goes in first, through the backend's own writes
    cached = [n - q for n, q in zip(seq_lens, query_lens, strict=True)]
    has_context = [i for i, c in enumerate(cached) if c]
    backend.forward(
        *(torch.cat([seqs[i][j][: cached[i]] for i in has_context]) for j in range(3)),
        k_cache, v_cache,
        metadata_for([cached[i] for i in has_context], [cached[i] for i in has_context],
                     [tables[i] for i in has_context]),
        scale,
    )
    new = [torch.cat([s[j][n - q :] for s, n, q in zip(seqs, seq_lens, query_lens, strict=True)]) for j in range(3)]
    pad = 3
    new = [torch.cat([x, torch.randn(pad, *x.shape[1:], dtype=dtype)]) for x in new]
    out = backend.forward(*new, k_cache, v_cache, metadata_for(seq_lens, query_lens, tables, pad), scale)

    expected = torch.cat([causal_reference(*s, scale)[n - q :] for s, n, q in zip(seqs, seq_lens, query_lens,
                                                                                  strict=True)])
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(out[: -pad], expected, atol=tol, rtol=tol)
    for i, table in enumerate(tables):
        paged_k = k_cache[table].flatten(0, 1)[: seq_lens[i]]
        torch.testing.assert_close(paged_k, seqs[i][1], atol=0, rtol=0)


def test_selector() -> None:
    assert isinstance(get_attention_backend(None, torch.device("cpu")), TorchAttentionBackend)
    assert isinstance(get_attention_backend("torch", torch.device("cpu")), TorchAttentionBackend)
    with pytest.raises(ValueError, match="available: torch"):
        get_attention_backend("nonesuch", torch.device("cpu"))
