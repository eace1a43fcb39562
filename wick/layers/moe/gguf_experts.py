"""A GGUF file's experts kept in their block format.

Each of w13 (every expert's gate rows, then its up rows) and w2 is held as [experts, rows, row bytes] of uint8 in
one GGUF type, about the file's size instead of bf16's. On a GPU, up to EXPERT_GEMV_MAX_PAIRS (token, expert)
pairs (decode) run the int8 GEMVs of Q4_K and Q6_K, each pair's expert chosen inside the kernel; more pairs, or
other types, decode the layer's experts whole for the fused kernel. On the CPU the reference decodes each expert
a token chose as it meets it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gguf import GGMLQuantizationType

from wick.loader.gguf_dequant import dequantize

# (token, expert) pairs up to which the GEMVs run (each pair reads its expert); past them the layer's experts are
# decoded whole and each is read once by the fused kernel. On an H100 the GEMVs took 550 against 1,019 us at 512
# pairs of Qwen3-30B-A3B's experts and 1,082 against 1,027 at 1,024 (benchmarks/kernels/bench_fused_moe.py).
EXPERT_GEMV_MAX_PAIRS = 512


@dataclass
class PackedExperts:
    """`data` [experts, rows, row bytes] of `qtype` blocks over `columns` columns, dequantized into `dtype`."""

    data: torch.Tensor
    qtype: GGMLQuantizationType
    columns: int
    dtype: torch.dtype

    @property
    def shape(self) -> tuple[int, int, int]:
        return self.data.shape[0], self.data.shape[1], self.columns

    def __getitem__(self, expert: int) -> torch.Tensor:
        """One expert's matrix [rows, columns] in `dtype`."""
        return dequantize(self.data[expert], self.qtype, self.shape[1:]).to(self.dtype)

    def dequantize_all(self) -> torch.Tensor:
        """Every expert's matrix: [experts, rows, columns] in `dtype`."""
        experts, rows, columns = self.shape
        flat = self.data.view(experts * rows, -1)
        if self.data.is_cuda:
            from wick.kernels.gguf_matmul import TRITON_TYPES, gguf_dequantize

            if self.qtype in TRITON_TYPES:
                return gguf_dequantize(flat, self.qtype, (experts * rows, columns), self.dtype).view(self.shape)
        return dequantize(flat, self.qtype, (experts * rows, columns)).to(self.dtype).view(self.shape)


def fused_experts_gguf(x: torch.Tensor, w13: PackedExperts, w2: PackedExperts, topk_weights: torch.Tensor,
                       topk_ids: torch.Tensor, gemv_max_pairs: int = EXPERT_GEMV_MAX_PAIRS) -> torch.Tensor:
    """fused_experts (wick/kernels/fused_moe.py) over packed experts, on a GPU; gemv_max_pairs: the most pairs the
    GEMVs take (for benchmarks)."""
    from wick.kernels.activation import silu_and_mul
    from wick.kernels.fused_moe import fused_experts
    from wick.kernels.gguf_matmul import gguf_expert_gemv, runs_expert_gemv

    tokens, top_k = topk_ids.shape
    if tokens * top_k <= gemv_max_pairs and runs_expert_gemv(w13.data, w13.qtype) \
            and runs_expert_gemv(w2.data, w2.qtype):
        ids = topk_ids.flatten()
        gate_up = gguf_expert_gemv(x, w13.data, w13.qtype, w13.columns, ids, top_k)
        down = gguf_expert_gemv(silu_and_mul(gate_up), w2.data, w2.qtype, w2.columns, ids, 1)
        weighted = down.view(tokens, top_k, -1).float() * topk_weights.float().unsqueeze(-1)
        return weighted.sum(1).to(x.dtype)
    return fused_experts(x, w13.dequantize_all(), w2.dequantize_all(), topk_weights, topk_ids)
