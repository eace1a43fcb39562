"""Bidirectional attention over a packed batch of whole sequences (encoders): no KV cache, every token of a
sequence sees every other. On a GPU in half precision the packed tokens attend as they are (`VarlenLayout`:
FlashAttention's variable-length kernel, which torch ships); elsewhere the batch is padded to its longest sequence
once per step (`PaddedLayout`), so that one SDPA call with a key mask serves all sequences of every layer."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class PaddedLayout:
    """Where each packed token goes in a [num_seqs, max_len] grid, and back."""

    num_seqs: int
    max_len: int
    gather: torch.Tensor  # [num_seqs * max_len] packed row of each grid cell; num_tokens (a zero row) for padding
    scatter: torch.Tensor  # [num_tokens] grid cell of each packed token
    key_mask: torch.Tensor | None  # [num_seqs, 1, 1, max_len] True where a key is real; None when none pads

    @classmethod
    def build(cls, query_start_loc: list[int], device: torch.device) -> PaddedLayout:
        starts = torch.tensor(query_start_loc[:-1])
        lengths = torch.tensor(query_start_loc[1:]) - starts
        num_seqs, max_len, num_tokens = len(lengths), int(lengths.max()), query_start_loc[-1]
        offsets = torch.arange(max_len)
        valid = offsets[None, :] < lengths[:, None]
        gather = torch.where(valid, starts[:, None] + offsets[None, :], num_tokens).flatten()
        scatter = valid.flatten().nonzero().squeeze(1)
        key_mask = None if bool(valid.all()) else valid[:, None, None, :].to(device, non_blocking=True)
        return cls(num_seqs, max_len, gather.to(device, non_blocking=True), scatter.to(device, non_blocking=True),
                   key_mask)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        """q, k, v [num_tokens, H, D] -> [num_tokens, H, D]."""
        num_heads, head_dim = q.shape[1:]
        qkv = torch.stack([q, k, v])  # [3, T, H, D]
        qkv = torch.cat([qkv, qkv.new_zeros(3, 1, num_heads, head_dim)], dim=1)[:, self.gather]
        qkv = qkv.view(3, self.num_seqs, self.max_len, num_heads, head_dim).transpose(2, 3)
        out = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], attn_mask=self.key_mask, scale=scale)
        return out.transpose(1, 2).reshape(-1, num_heads, head_dim)[self.scatter]


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor, max_len: int,
                     scale: float) -> torch.Tensor:
    """q, k, v [num_tokens, H, D] of sequences packed back to back (`cu_seqlens` int32 [num_seqs + 1] on the
    device) -> [num_tokens, H, D]; CUDA, float16 or bfloat16."""
    return torch.ops.aten._flash_attention_forward(q, k, v, cu_seqlens, cu_seqlens, max_len, max_len, 0.0, False,
                                                   False, scale=scale)[0]


@dataclass
class VarlenLayout:
    cu_seqlens: torch.Tensor
    max_len: int

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        return varlen_attention(q, k, v, self.cu_seqlens, self.max_len, scale)


def encoder_layout(query_start_loc: list[int], device: torch.device, dtype: torch.dtype) -> PaddedLayout | VarlenLayout:
    """The step's layout: varlen on CUDA in float16 or bfloat16, the padded grid elsewhere."""
    if device.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        lengths = [end - start for start, end in zip(query_start_loc[:-1], query_start_loc[1:], strict=True)]
        cu_seqlens = torch.tensor(query_start_loc, dtype=torch.int32, pin_memory=True).to(device, non_blocking=True)
        return VarlenLayout(cu_seqlens, max(lengths))
    return PaddedLayout.build(query_start_loc, device)
