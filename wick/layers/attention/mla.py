"""Multi-head latent attention (DeepSeek V2/V3) over its own paged cache of compressed KV.

Each token's cache entry is one row of kv_lora_rank + qk_rope_head_dim values: the normalised latent
c (from which every head's keys and values are projected) and the rotated shared key k_pe. Pages are
[num_blocks, block_size, 1, kv_lora_rank + qk_rope_head_dim], one tensor per layer.

Attention runs in the latent space (the up-projection absorbed into the query and the output): with
W_uk [H, nope, r] and W_uv [H, v, r] the two halves of kv_b_proj, score(q, j) = (q_nope W_uk) . c_j +
q_pe . k_pe_j and out = W_uv (softmax . c), so a step reads only the compressed cache. An fp8 cache holds the
entries in e4m3 with scale 1.0 (the latent is normalised).
mla_attention_ref is the plain form (keys and values expanded per head), which the tests compare with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from wick.kernels.kv_cache_write import as_storable, write_pages
from wick.layers.attention.metadata import get_forward_context


class MLAAttention(nn.Module):
    def __init__(self, num_heads: int, kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, scale: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.kv_lora_rank = kv_lora_rank
        self.qk_nope_head_dim = qk_nope_head_dim
        self.qk_rope_head_dim = qk_rope_head_dim
        self.v_head_dim = v_head_dim
        self.scale = scale
        self.kv_cache = torch.empty(0)

    def kv_cache_shapes(self, num_blocks: int, block_size: int) -> list[tuple[int, ...]]:
        return [(num_blocks, block_size, 1, self.kv_lora_rank + self.qk_rope_head_dim)]

    def bind_kv_cache(self, caches: list[torch.Tensor]) -> None:
        (self.kv_cache,) = caches

    def forward(self, q_nope: torch.Tensor, q_pe: torch.Tensor, latent: torch.Tensor, k_pe: torch.Tensor,
                kv_b_weight: torch.Tensor) -> torch.Tensor:
        """q_nope [T, H, nope], q_pe [T, H, rope] (rotated), latent [T, r] (normalised), k_pe [T, rope]
        (rotated), kv_b_weight [H * (nope + v), r]. Returns [T, H * v]."""
        metadata = get_forward_context().attn_metadata
        tokens, slots = metadata.written
        entries = torch.cat((latent, k_pe), dim=-1)
        if tokens is not None:
            entries = entries.index_select(0, tokens)
        write_pages(self.kv_cache, slots, entries[:, None], 1.0)

        w = kv_b_weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        w_uk, w_uv = w.split([self.qk_nope_head_dim, self.v_head_dim], dim=1)
        q_latent = torch.einsum("thn,hnr->thr", q_nope, w_uk)
        out = q_nope.new_zeros(q_nope.shape[0], self.num_heads, self.v_head_dim)
        block_size = self.kv_cache.shape[1]
        starts = metadata.query_start_loc_cpu
        for i, seq_len in enumerate(metadata.seq_lens_cpu):
            start, end = starts[i], starts[i + 1]
            blocks = metadata.block_tables[i, : -(-seq_len // block_size)]
            entries = as_storable(self.kv_cache)[blocks].flatten(0, 2)[:seq_len].view(self.kv_cache.dtype)
            entries = entries.to(q_nope.dtype)
            c, pe = entries.split([self.kv_lora_rank, self.qk_rope_head_dim], dim=-1)
            scores = (torch.einsum("thr,kr->htk", q_latent[start:end], c)
                      + torch.einsum("the,ke->htk", q_pe[start:end], pe)).float() * self.scale
            query_pos = torch.arange(seq_len - (end - start), seq_len, device=c.device)
            visible = torch.arange(seq_len, device=c.device) <= query_pos[:, None]
            probs = scores.masked_fill(~visible, float("-inf")).softmax(dim=-1).to(c.dtype)
            out[start:end] = torch.einsum("htk,kr,hvr->thv", probs, c, w_uv)
        return out.flatten(1)


def mla_attention_ref(q_nope: torch.Tensor, q_pe: torch.Tensor, latent: torch.Tensor, k_pe: torch.Tensor,
                      kv_b_weight: torch.Tensor, num_heads: int, v_head_dim: int, scale: float) -> torch.Tensor:
    """Causal MLA of one sequence in the plain form: keys [k_nope_h, k_pe], values v_h, per head."""
    kv = F.linear(latent, kv_b_weight).view(latent.shape[0], num_heads, -1)
    k_nope, v = kv.split([kv.shape[-1] - v_head_dim, v_head_dim], dim=-1)
    q = torch.cat((q_nope, q_pe), dim=-1).transpose(0, 1)
    k = torch.cat((k_nope, k_pe[:, None].expand(-1, num_heads, -1)), dim=-1).transpose(0, 1)
    out = F.scaled_dot_product_attention(q, k, v.transpose(0, 1), is_causal=True, scale=scale)
    return out.transpose(0, 1).flatten(1)
