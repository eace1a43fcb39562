"""The attention layer the models use: reshapes heads and hands off to the step's backend."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from wick.kernels.kv_cache_write import KVCacheTarget
from wick.layers.attention.metadata import get_forward_context
from wick.layers.pending_combine import PendingCombine

if TYPE_CHECKING:
    from wick.layers.norm import RMSNorm
    from wick.layers.rotary import RopeInputs, RotaryEmbedding


class Attention(nn.Module):
    """q [T, H*D], k and v [T, Hkv*D] -> [T, H*D].

    k_cache and v_cache ([num_blocks, block_size, Hkv, D]) are bound by the model runner once it has
    allocated the KV cache in the shapes kv_cache_shapes() declares.
    sliding_window and logits_soft_cap: see AttentionBackend.forward.
    An fp8 cache holds K / k_scale and V / v_scale; the scales are 1.0 (vLLM's default when a
    checkpoint brings none), and e4m3 saturates at 448.
    """

    def __init__(self, num_heads: int, head_dim: int, scale: float, num_kv_heads: int,
                 sliding_window: int | None = None, logits_soft_cap: float | None = None) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.scale = scale
        self.num_kv_heads = num_kv_heads
        self.sliding_window = sliding_window
        self.logits_soft_cap = logits_soft_cap
        self.k_cache = torch.empty(0)
        self.v_cache = torch.empty(0)
        self.k_scale = 1.0
        self.v_scale = 1.0

    def kv_cache_shapes(self, num_blocks: int, block_size: int) -> list[tuple[int, ...]]:
        """The shapes of this layer's cache tensors (K pages, V pages), which bind_kv_cache then takes."""
        shape = (num_blocks, block_size, self.num_kv_heads, self.head_dim)
        return [shape, shape]

    def bind_kv_cache(self, caches: list[torch.Tensor]) -> None:
        self.k_cache, self.v_cache = caches

    def cache_target(self) -> KVCacheTarget | None:
        """Where this step's new K/V go, when the step's backend lets the caller write them (the caller then
        passes kv_written=True to forward); None when the backend writes them itself."""
        context = get_forward_context()
        if not context.backend.caller_writes_kv:
            return None
        return KVCacheTarget(self.k_cache, self.v_cache, context.attn_metadata.slot_mapping, self.k_scale,
                             self.v_scale)

    def rotate_and_attend(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          rotary: RotaryEmbedding, norms: tuple[RMSNorm, RMSNorm] | None = None,
                          pending: bool = False) -> torch.Tensor | PendingCombine:
        """forward() over q and k rotated by `rotary` (q's and k's heads RMS-normalized by `norms` first). At a decode
        step of a backend that rotates them itself (rotates_at_decode), no rotary kernel runs: its kernel does."""
        context = get_forward_context()
        if context.backend.rotates_at_decode and context.attn_metadata.max_query_len == 1:
            rope = rotary.kernel_inputs(q, norms)
            if rope is not None:
                return self.forward(q, k, v, rope=rope, pending=pending)
        cache = self.cache_target()
        q, k = rotary(positions, q, k, norms, v, cache)
        return self.forward(q, k, v, kv_written=cache is not None, pending=pending)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_written: bool = False,
                rope: RopeInputs | None = None, pending: bool = False) -> torch.Tensor | PendingCombine:
        """pending (its reader takes a PendingCombine): a one-row step's output may be left for the reader to combine,
        where the backend defers the combine (defers_combine)."""
        context = get_forward_context()
        extra = {"pending": True} if pending and context.backend.defers_combine and q.shape[0] == 1 else {}
        out = context.backend.forward(
            q.view(-1, self.num_heads, self.head_dim),
            k.view(-1, self.num_kv_heads, self.head_dim),
            v.view(-1, self.num_kv_heads, self.head_dim),
            self.k_cache,
            self.v_cache,
            context.attn_metadata,
            self.scale,
            sliding_window=self.sliding_window,
            logits_soft_cap=self.logits_soft_cap,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
            kv_written=kv_written,
            rope=rope,
            **extra,
        )
        if isinstance(out, PendingCombine):
            return out
        return out.view(-1, self.num_heads * self.head_dim)
