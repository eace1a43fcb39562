"""MoE experts kept in GGUF blocks: a GGUF file's, or a float checkpoint's quantized in situ.

Each of w13 (every expert's gate rows, then its up rows) and w2 is held as [experts, rows, row bytes] of uint8 in
one GGUF type (any of the quantized types the loader reads), about the file's size instead of bf16's. On a GPU, a
few (token, expert) pairs (decode, EXPERT_GEMV_MAX_PAIRS and EXPERT_GEMV_PAIRS_PER_EXPERT an expert) run the GEMVs
(int8 ones where the type has one, else a float one), each pair's expert chosen inside the kernel; more pairs run
the tile kernel over the pairs sorted by expert (each expert's blocks read once a tile of its pairs), and past
EXPERT_TILES_MAX_PAIRS the experts are decoded whole for the fused MoE kernel. On the CPU the reference decodes each
expert a token chose as it meets it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from gguf import GGMLQuantizationType

from wick.loader.gguf_dequant import BLOCK_TYPES, dequantize

if TYPE_CHECKING:
    from wick.kernels.pair_sum import PairRows

# (token, expert) pairs up to which the GEMVs run (each pair reads its expert), and no more than
# EXPERT_GEMV_PAIRS_PER_EXPERT times the experts; past them the tile kernel reads each expert once a tile of its
# pairs. On an H100 (benchmarks/kernels/bench_fused_moe.py --gguf Q4_K): Qwen3-30B-A3B's experts (128), GEMVs 158
# against tiles 165 us at 128 pairs, 286 against 197 at 256; Mixtral's shape (8), 540 against 759 at 16 pairs,
# 1,100 against 830 at 32.
EXPERT_GEMV_MAX_PAIRS = 128
EXPERT_GEMV_PAIRS_PER_EXPERT = 2
# Pairs past which the experts are decoded whole for the fused MoE kernel: a tile decodes its expert's blocks for
# each tile of that expert's pairs. Qwen3-30B-A3B's experts (Q4_K gate/up, Q6_K down) took 1,227 us in tiles
# against 1,752 decoded at 16,384 pairs, 2,117 against 2,121 at 32,768, 3,729 against 2,868 at 65,536; Q3_K's 2,360
# against 1,956 at 32,768 (H100).
EXPERT_TILES_MAX_PAIRS = 16384


def packs_experts(qtype: GGMLQuantizationType, columns: int) -> bool:
    """Whether experts of `qtype` over rows of `columns` values stay packed: every quantized type (wick/kernels/
    gguf_decode.py reads them all; float experts load as floats), in rows of whole 256-value groups (a K-quant's
    super-blocks; eight blocks of the others), which a tensor-parallel rank's down projection may cut off."""
    return qtype in BLOCK_TYPES and columns % 256 == 0


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
                       topk_ids: torch.Tensor, path: str | None = None, unsummed: bool = False
                       ) -> torch.Tensor | PairRows:
    """fused_experts (wick/kernels/fused_moe.py) over packed experts, on a GPU. path (for benchmarks; None picks
    the first that runs): "gemv", the GEMVs, up to the bound above; "tiles", the tile kernel over the pairs
    sorted by expert, up to EXPERT_TILES_MAX_PAIRS; "decoded", the experts decoded whole. unsummed: the pairs of the
    first two are left unsummed (pair_sum.PairRows), for the norm after the layer to sum."""
    from wick.kernels.activation import act_and_mul_q8, silu_and_mul
    from wick.kernels.fused_moe import fused_experts, pair_bound
    from wick.kernels.gguf_matmul import gguf_expert_gemv, runs_expert_gemv, runs_expert_int8_gemv
    from wick.kernels.gguf_tiles import expert_tile_config, gguf_expert_matmul, runs_expert_tiles
    from wick.kernels.moe_align import moe_align
    from wick.kernels.pair_sum import summed_unless

    tokens, top_k = topk_ids.shape
    num_pairs = tokens * top_k
    gemv = runs_expert_gemv(w13.data, w13.qtype) and runs_expert_gemv(w2.data, w2.qtype)
    tiles = gemv and runs_expert_tiles(w13.data, w13.qtype) and runs_expert_tiles(w2.data, w2.qtype)
    if path is None:
        gemv_max_pairs = pair_bound(EXPERT_GEMV_MAX_PAIRS, EXPERT_GEMV_PAIRS_PER_EXPERT, w13.shape[0])
        path = ("gemv" if gemv and num_pairs <= gemv_max_pairs else
                "tiles" if tiles and num_pairs <= EXPERT_TILES_MAX_PAIRS else "decoded")
    if (path == "gemv" and not gemv) or (path == "tiles" and not tiles):
        raise ValueError(f"experts in {w13.qtype.name} and {w2.qtype.name} have no {path} path")
    if path == "decoded":
        return fused_experts(x, w13.dequantize_all(), w2.dequantize_all(), topk_weights, topk_ids)
    if path == "gemv":
        ids = topk_ids.flatten()
        gate_up = gguf_expert_gemv(x, w13.data, w13.qtype, w13.columns, ids, top_k)
        # an int8 down GEMV takes its rows rounded by the activation kernel: no rounding kernel between them
        act = act_and_mul_q8(gate_up, "silu") if runs_expert_int8_gemv(w2.data, w2.qtype) else silu_and_mul(gate_up)
        down = gguf_expert_gemv(act, w2.data, w2.qtype, w2.columns, ids, 1, dtype=x.dtype)
    else:
        config = expert_tile_config(num_pairs, w13.shape[0], x.dtype)
        layout = moe_align(topk_ids, w13.shape[0], config[0])
        gate_up = gguf_expert_matmul(x, w13.data, w13.qtype, w13.columns, *layout, config, num_pairs, top_k)
        down = gguf_expert_matmul(silu_and_mul(gate_up), w2.data, w2.qtype, w2.columns, *layout, config, num_pairs, 1)
    return summed_unless(down, topk_weights, unsummed)
