"""The pure-torch reference of kernels.paged_attention, which its tests compare with: fp32, one request at a time."""

from __future__ import annotations

import math

import torch

from wick.kernels.kv_cache_write import as_storable


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> torch.Tensor:
    """Pure-torch reference of paged_attention, in fp32, one request at a time; other rows are zero."""
    _, block_size, num_kv_heads, _ = k_cache.shape
    group = q.shape[1] // num_kv_heads
    out = torch.zeros_like(q)
    starts, lens = query_start_loc.tolist(), seq_lens.tolist()
    for i, seq_len in enumerate(lens):
        start, end = starts[i], starts[i + 1]
        pages = block_tables[i, : math.ceil(seq_len / block_size)].long()
        keys, values = (as_storable(c)[pages].flatten(0, 1)[:seq_len].view(c.dtype).float()
                        .repeat_interleave(group, dim=1) * c_scale
                        for c, c_scale in ((k_cache, k_scale), (v_cache, v_scale)))
        scores = torch.einsum("qhd,khd->hqk", q[start:end].float(), keys) * scale
        query_pos = torch.arange(seq_len - (end - start), seq_len, device=q.device)
        key_pos = torch.arange(seq_len, device=q.device)[None, :]
        visible = key_pos <= query_pos[:, None]
        if sliding_window:
            visible &= key_pos > query_pos[:, None] - sliding_window
        if logits_soft_cap:
            scores = logits_soft_cap * torch.tanh(scores / logits_soft_cap)
        probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, values).to(q.dtype)
    return out
