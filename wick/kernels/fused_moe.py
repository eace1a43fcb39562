"""Fused mixture-of-experts: each token's top-k experts in two grouped GEMMs.

The (token, expert) pairs are sorted by expert and each expert's run is padded to BLOCK_M rows, so a
program's tile of rows belongs to one expert and reads that expert's weights once for all of them
(moe_align, on the device, no host sync). The first GEMM computes a tile's gate and up
columns together from w13 and writes silu(gate) * up; the second multiplies by w2 and by the routing
weight. The top-k partial outputs of each token are then summed by a third kernel (pair_sum.py; torch's sum over the
middle dim took 4.6 us at one token on an H100). Accumulation is in fp32.

Experts in fp8 (e4m3, W8A16) carry float32 scales over [SCALE_N, SCALE_K] tiles of each expert's matrix (128 x 128
as FP8 checkpoints ship them, one a row for in-situ fp8, one a shard for per-tensor checkpoints): a tile of B is
converted to the activations' dtype in registers (exactly: e4m3 fits in bf16) and each BLOCK_K step's product
takes its columns' scales, or, where one scale covers a whole row of K, the sum takes them once. Experts in 4 or 8
bits (GPTQ and AWQ, W4A16 / W8A16) come packed as GPTQ packs them, K rows to an int32 word, with group scales and
zero points: a tile's values minus their zero points are converted exactly and its product takes the group's
scales as fp8 steps take theirs.

The grid is sized by an upper bound on the padded row count (pairs / BLOCK_M + min(pairs, experts)
tiles); tiles past the real count return at once, so the launch depends on the shapes only. With few
pairs (decode) each pair gets a tile of its own instead and nothing is sorted.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from wick.kernels.moe_align import moe_align
from wick.kernels.pair_sum import sum_pairs
from wick.kernels.pdl import hopper_or_later
from wick.kernels.wna16_matmul import load_unpacked

# The float32 scales of fp8 experts [E, N, K]: (scale [E, ceil(N / block[0]), ceil(K / block[1])], block), each over a
# block[0] x block[1] tile of an expert's matrix.
WeightScales = tuple[torch.Tensor, tuple[int, int]]


class GroupScales(NamedTuple):
    """The group scales and zero points of 4- or 8-bit experts B [E, K / (32 / bits), N] int32, each word holding
    consecutive rows of K from its lowest bits up: W_e[n, k] = (q - zeros[e, k // group, n]) * scales[e, k // group,
    n], scales and zeros [E, ceil(K / group), N] in the activations' dtype (zero points as values)."""

    scales: torch.Tensor
    zeros: torch.Tensor
    bits: int
    group: int


@triton.jit
def _b_tile(b_base, b_desc, desc_row, rows, row_ok, ks, k_ok, stride_bn, stride_bk, s_base, z_base, k0, K, stride_sn,
            stride_sk, dtype, SCALE_N: tl.constexpr, SCALE_K: tl.constexpr, PER_STEP: tl.constexpr, BITS: tl.constexpr,
            TMA: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """B's [BLOCK_K, BLOCK_N] tile of rows `rows` in `dtype` (BITS: unpacked from words of 32 / BITS values along K,
    less their zero points; TMA: rows desc_row on of b_desc, by the tensor memory accelerator), and the scale of each
    of its rows for this step (1 unless PER_STEP)."""
    if TMA:
        b = tl.trans(b_desc.load([desc_row, k0])).to(dtype)
    elif BITS:
        q = load_unpacked(b_base, k0, rows, row_ok, stride_bk, stride_bn, K, BITS, BLOCK_K, BLOCK_N)
        zero = tl.load(z_base + (rows // SCALE_N) * stride_sn + (k0 // SCALE_K) * stride_sk, mask=row_ok, other=0.0)
        b = (q.to(tl.float32) - zero.to(tl.float32)[None, :]).to(dtype)  # integers of at most 9 bits: exact
    else:
        b = tl.load(b_base + rows[None, :] * stride_bn + ks[:, None] * stride_bk, mask=k_ok[:, None] & row_ok[None, :],
                    other=0.0).to(dtype)
    if PER_STEP:
        scale = tl.load(s_base + (rows // SCALE_N) * stride_sn + (k0 // SCALE_K) * stride_sk, mask=row_ok, other=0.0)
    else:
        scale = 1.0
    return b, scale


@triton.jit
def _pairs_tile(a_ptr, b_base, b_desc, b_row, c_ptr, weights_ptr, s_base, z_base, pairs, valid, pid_n, N, K,
                stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn, stride_sn, stride_sk,
                A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, MUL_WEIGHT: tl.constexpr, SCALING: tl.constexpr,
                SCALE_N: tl.constexpr, SCALE_K: tl.constexpr, BITS: tl.constexpr, TMA: tl.constexpr,
                BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr):
    """The output tile of the pairs `pairs` (valid where `valid`), all of one expert (B at b_base; with TMA its first
    row is row b_row of b_desc), and the columns of column tile pid_n."""
    a_rows = pairs // A_ROW_DIV
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    acc = tl.zeros([pairs.shape[0], BLOCK_N], dtype=tl.float32)
    if GATED:
        acc_up = tl.zeros([pairs.shape[0], BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(a_ptr + a_rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=valid[:, None] & k_ok[None, :], other=0.0)
        b, scale = _b_tile(b_base, b_desc, b_row + pid_n * BLOCK_N, cols, col_ok, ks, k_ok, stride_bn, stride_bk,
                           s_base, z_base, k0, K, stride_sn, stride_sk, a.dtype, SCALE_N, SCALE_K, SCALING == "step",
                           BITS, TMA, BLOCK_K, BLOCK_N)
        if SCALING == "step":
            acc += tl.dot(a, b, input_precision=DOT_PRECISION) * scale[None, :]
        else:
            acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if GATED:
            b_up, scale_up = _b_tile(b_base, b_desc, b_row + N + pid_n * BLOCK_N, cols + N, col_ok, ks, k_ok,
                                     stride_bn, stride_bk, s_base, z_base, k0, K, stride_sn, stride_sk, a.dtype,
                                     SCALE_N, SCALE_K, SCALING == "step", BITS, TMA, BLOCK_K, BLOCK_N)
            if SCALING == "step":
                acc_up += tl.dot(a, b_up, input_precision=DOT_PRECISION) * scale_up[None, :]
            else:
                acc_up = tl.dot(a, b_up, acc_up, input_precision=DOT_PRECISION)
    if SCALING == "row":
        acc *= tl.load(s_base + (cols // SCALE_N) * stride_sn, mask=col_ok, other=0.0)[None, :]
        if GATED:
            acc_up *= tl.load(s_base + ((cols + N) // SCALE_N) * stride_sn, mask=col_ok, other=0.0)[None, :]
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + pairs, mask=valid, other=0.0)[:, None]
    tl.store(c_ptr + pairs[:, None] * stride_cm + cols[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=valid[:, None] & col_ok[None, :])


@triton.jit(do_not_specialize=["num_pairs", "num_tiles_m"])
def _moe_gemm_kernel(
    a_ptr, b_ptr, b_desc, c_ptr, weights_ptr, sorted_ids_ptr, block_expert_ptr, num_padded_ptr, s_ptr, z_ptr,
    N, K, num_pairs, num_tiles_m,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn, stride_se, stride_sn, stride_sk,
    A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, MUL_WEIGHT: tl.constexpr, DIRECT: tl.constexpr,
    SCALING: tl.constexpr, SCALE_N: tl.constexpr, SCALE_K: tl.constexpr, BITS: tl.constexpr, TMA: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    TAIL_M: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """C[pair, n] = (A[pair // A_ROW_DIV] @ B[expert].T)[n]: GATED reads columns n and N + n of B (gate and
    up) and stores silu(gate) * up; MUL_WEIGHT multiplies by the pair's routing weight. DIRECT: tile i
    holds pair i alone, its expert read from block_expert_ptr[i] (the top-k ids; nothing sorted). SCALING "row" or
    "step": B is fp8 with scales s over [SCALE_N, SCALE_K] tiles, one a row of K ("row": SCALE_K >= K) or one a
    BLOCK_K step ("step": BLOCK_K divides SCALE_K). BITS (4 or 8; 0: B is float): B [E, K / (32 / BITS), N] int32
    with scales s and zero points z [E, ceil(K / SCALE_K), N] (SCALE_N 1, z strided as s), the strides of B's N and
    K those of its columns and words. TMA (float B, contiguous): B's tiles come through b_desc, B as [E * rows, K].
    The grid is one-dimensional over num_tiles_m x cdiv(N, BLOCK_N) tiles, taken
    GROUP_M row tiles at a time, every column tile of a group's rows before the next group (GROUP_M 0: every row
    tile of a column before the next column). TAIL_M (0: none): a row tile with no more than TAIL_M pairs (the last of
    an expert's run, mostly padding) multiplies only its first TAIL_M rows."""
    pid = tl.program_id(0)
    if GROUP_M == 0:
        pid_m = pid % num_tiles_m
        pid_n = pid // num_tiles_m
    else:
        tiles_n = tl.cdiv(N, BLOCK_N)
        first_m = pid // (GROUP_M * tiles_n) * GROUP_M
        group_m = min(num_tiles_m - first_m, GROUP_M)
        in_group = pid % (GROUP_M * tiles_n)
        pid_m = first_m + in_group % group_m
        pid_n = in_group // group_m
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    b_base = b_ptr + expert * stride_be
    s_base = s_ptr + expert * stride_se
    z_base = z_ptr + expert * stride_se
    args = (a_ptr, b_base, b_desc, (expert * (stride_be // stride_bn)).to(tl.int32), c_ptr, weights_ptr, s_base, z_base)
    strides = (stride_am, stride_ak, stride_bn, stride_bk, stride_cm, stride_cn, stride_sn, stride_sk)
    if DIRECT:
        pairs = pid_m + tl.zeros([BLOCK_M], dtype=tl.int64)
        _pairs_tile(*args, pairs, tl.arange(0, BLOCK_M) == 0, pid_n, N, K, *strides, A_ROW_DIV, GATED, MUL_WEIGHT,
                    SCALING, SCALE_N, SCALE_K, BITS, TMA, BLOCK_N, BLOCK_K, DOT_PRECISION)
    else:
        if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
            return
        first = sorted_ids_ptr + pid_m * BLOCK_M
        if TAIL_M > 0 and tl.load(first + TAIL_M) >= num_pairs:  # a tile's pairs come before its padding
            tail = tl.load(first + tl.arange(0, TAIL_M)).to(tl.int64)
            _pairs_tile(*args, tail, tail < num_pairs, pid_n, N, K, *strides, A_ROW_DIV, GATED, MUL_WEIGHT,
                        SCALING, SCALE_N, SCALE_K, BITS, TMA, BLOCK_N, BLOCK_K, DOT_PRECISION)
        else:
            pairs = tl.load(first + tl.arange(0, BLOCK_M)).to(tl.int64)
            _pairs_tile(*args, pairs, pairs < num_pairs, pid_n, N, K, *strides, A_ROW_DIV, GATED, MUL_WEIGHT,
                        SCALING, SCALE_N, SCALE_K, BITS, TMA, BLOCK_N, BLOCK_K, DOT_PRECISION)


class MoeTile(NamedTuple):
    """One GEMM's tiles: BLOCK_M x BLOCK_N outputs over BLOCK_K steps, its warps and pipeline stages, the row tiles a
    group of the grid takes (0: one column at a time), and the rows a tile of mostly padding multiplies (0: all)."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    group_m: int = 0
    tail_m: int = 0


# The gate/up GEMM's tiles and the down GEMM's, of one block_m (the pairs' layout is shared).
MoeConfig = tuple[MoeTile, MoeTile]


def _same(tile: MoeTile) -> MoeConfig:
    return tile, tile


# Float experts' tiles by the most (token, expert) pairs they serve (benchmarks/kernels/bench_fused_moe.py --sweep);
# past the last bound, the last config. Qwen3-30B-A3B's experts at 16,384 pairs (H100, one sweep): the gate/up GEMM
# 367 us in the tiles both GEMMs shared before (128 x 128 x 64, 3 stages, a column at a time), 354 in 4 stages, 344
# with a row tile's column tiles taken together (group 1), 341 with tails of 32 rows; the down GEMM 297 us in the old
# tiles, 249 in 128 x 256 ones, 195 taken together, 195 with tails (283 against 308 at 32,768 pairs). With B's tiles by
# TMA, on an H200 (session 42): groups of 4 row tiles with tails of 16, gate/up 269.1 -> 262.7 us, down 160.2 -> 154.0.
MOE_CONFIGS: list[tuple[int, MoeConfig]] = [
    (256, _same(MoeTile(16, 64, 128, 4, 3))),
    (4096, (MoeTile(64, 64, 64, 4, 3, 1), MoeTile(64, 128, 64, 4, 4, 4))),
    (1 << 62, (MoeTile(128, 128, 64, 8, 4, 4, 16), MoeTile(128, 256, 64, 8, 4, 4, 16))),
]
# fp8 experts (B converted in registers) with a scale a row, and with 128 x 128 scale blocks (each step's product
# scaled). At 16,384 pairs of Qwen3-30B-A3B's experts (H100, one sweep), against the float experts' old tiles: a scale a
# row, gate/up 533 -> 391 us, down 265 -> 198; scale blocks, gate/up 740 -> 454, down 369 -> 266.
FP8_MOE_CONFIGS: list[tuple[int, MoeConfig]] = [
    (256, _same(MoeTile(16, 64, 128, 4, 3))),
    (4096, _same(MoeTile(64, 64, 64, 4, 3))),
    (1 << 62, (MoeTile(128, 64, 64, 4, 3, 1, 16), MoeTile(128, 128, 64, 8, 4, 4, 16))),
]
FP8_BLOCK_MOE_CONFIGS: list[tuple[int, MoeConfig]] = [
    *FP8_MOE_CONFIGS[:2],
    (1 << 62, (MoeTile(128, 64, 64, 4, 3, 4, 16), MoeTile(128, 64, 64, 4, 4, 4, 16))),
]


# Up to this many (token, expert) pairs, and no more than DIRECT_PAIRS_PER_EXPERT times the experts, each pair takes
# a tile of its own: no sorting kernels before the GEMMs (they cost more than the GEMMs at decode), at the price of
# reading an expert once per pair that chose it. With few experts many pairs share one: Mixtral's shape (8 experts
# of 4096 x 14336, top 2) took 2,680 us at 64 pairs a tile each against 1,019 sorted, 1,379 against 887 at 32, and
# was even at 16 (H100, `bench_fused_moe.py --experts 8 --top-k 2 --hidden-size 4096 --intermediate-size 14336`).
DIRECT_MAX_PAIRS = 64
DIRECT_PAIRS_PER_EXPERT = 2


def pair_bound(max_pairs: int, per_expert: int, num_experts: int) -> int:
    """The most (token, expert) pairs a path that reads an expert once per pair takes: max_pairs, and no more than
    per_expert times the experts (with few experts, many pairs share one)."""
    return min(max_pairs, per_expert * num_experts)


# The same over 4- or 8-bit experts, whose B tiles are unpacked at every step (Qwen3-30B-A3B's 4-bit experts on an H100,
# `bench_fused_moe.py --wna16 4 --sweep`: 382 against 574 us with MOE_CONFIGS' at 1,024 pairs, 1,101 against 1,642 at
# 16,384). Session 27's sweep of each GEMM (H100, 4-bit, groups of 128) kept the shapes and took tails and, for the down
# GEMM, groups of 4 row tiles: at 16,384 pairs gate/up 594.9 -> 589.8 us, down 334.8 -> 310.4; at 4,096 down 140.8 ->
# 134.0.
WNA16_MOE_CONFIGS: list[tuple[int, MoeConfig]] = [
    (1024, _same(MoeTile(16, 128, 128, 4, 3))),
    (1 << 62, (MoeTile(64, 128, 128, 4, 3, 0, 16), MoeTile(64, 128, 128, 4, 3, 4, 32))),
]


def moe_config(num_pairs: int, dtype: torch.dtype, experts: str = "float") -> MoeConfig:
    """The tiles for `num_pairs` pairs of activations in `dtype` against `experts` "float", "fp8" (a scale a row),
    "fp8_block" (scales over blocks of K) or "packed" (4- or 8-bit)."""
    table = {"float": MOE_CONFIGS, "fp8": FP8_MOE_CONFIGS, "fp8_block": FP8_BLOCK_MOE_CONFIGS,
             "packed": WNA16_MOE_CONFIGS}[experts]
    config = next(c for bound, c in table if num_pairs <= bound)
    if dtype == torch.float32:  # a float32 tile takes twice the shared memory a step
        return tuple(tile._replace(block_k=min(tile.block_k, 32)) for tile in config)
    return config


def _scaling(scales: WeightScales | GroupScales | None, k: int, block_k: int) -> tuple[str, int, int, int]:
    """(SCALING, SCALE_N, SCALE_K, BLOCK_K) for a GEMM over K = k with these scales."""
    if scales is None:
        return "none", 1, 1, block_k
    scale_n, scale_k = (1, scales.group) if isinstance(scales, GroupScales) else scales[1]
    if scale_k >= k:
        return "row", scale_n, scale_k, block_k
    return "step", scale_n, scale_k, min(block_k, scale_k & -scale_k)  # BLOCK_K divides SCALE_K


def expert_kind(scales: WeightScales | GroupScales | None, k: int) -> str:
    """moe_config's kind of experts whose gate/up GEMM over K = k takes these scales."""
    if isinstance(scales, GroupScales):
        return "packed"
    if scales is None:
        return "float"
    return "fp8" if scales[1][1] >= k else "fp8_block"


def _has_tma(device: torch.device) -> bool:
    """Whether B's tiles can come by the tensor memory accelerator: Hopper and later (the interpreter on the CPU
    runs the same path)."""
    return device.type == "cpu" or hopper_or_later(device)


def moe_gemm(a: torch.Tensor, b: torch.Tensor, scales: WeightScales | GroupScales | None, out: torch.Tensor,
              weights: torch.Tensor, layout: tuple[torch.Tensor, torch.Tensor, torch.Tensor], num_pairs: int,
              a_row_div: int, gated: bool, direct: bool, tile: MoeTile) -> None:
    """One of fused_experts' GEMMs over the pairs' layout (moe_align's, or where `direct` the top-k ids as each
    part): out[pair] = a[pair // a_row_div] @ b[expert].T, as silu(gate) * up where `gated`, else times the pair's
    routing weight (weights, float32)."""
    block_m, block_n, block_k, warps, stages, group_m, tail_m = tile
    if tail_m and not (16 <= tail_m < block_m and tail_m & (tail_m - 1) == 0):
        raise ValueError(f"a tail of {tail_m} rows needs a power of two from 16 to below BLOCK_M {block_m}")
    n = out.shape[1]
    bits = scales.bits if isinstance(scales, GroupScales) else 0
    if bits:  # [E, K / pack, N]: N along the last dimension, K's words along the middle one
        k, b_strides = b.shape[1] * (32 // bits), (b.stride(0), b.stride(2), b.stride(1))
        s, z = scales.scales, scales.zeros
        s_strides = (s.stride(0), s.stride(2), s.stride(1))
    else:
        k, b_strides = b.shape[2], (b.stride(0), b.stride(1), b.stride(2))
        s = z = scales[0] if scales is not None else weights
        s_strides = (s.stride(0), s.stride(1), s.stride(2)) if scales is not None else (0, 0, 0)
    scaling, scale_n, scale_k, block_k = _scaling(scales, k, block_k)
    sorted_ids, block_expert, num_padded = layout
    tiles_m = block_expert.shape[0]
    tma = (scales is None and not direct and b.is_contiguous() and (k * b.element_size()) % 16 == 0
           and b.data_ptr() % 16 == 0 and _has_tma(b.device))  # a descriptor's rows start at 16-byte bounds
    b_desc = TensorDescriptor.from_tensor(b.view(-1, k), [block_n, block_k]) if tma else b
    _moe_gemm_kernel[(tiles_m * triton.cdiv(n, block_n),)](
        a, b, b_desc, out, weights, sorted_ids, block_expert, num_padded, s, z,
        n, k, num_pairs, tiles_m,
        a.stride(0), a.stride(1), *b_strides, out.stride(0), out.stride(1), *s_strides,
        A_ROW_DIV=a_row_div, GATED=gated, MUL_WEIGHT=not gated, DIRECT=direct,
        SCALING=scaling, SCALE_N=scale_n, SCALE_K=scale_k, BITS=bits, TMA=tma,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m, TAIL_M=0 if direct else tail_m,
        DOT_PRECISION="ieee" if a.dtype == torch.float32 else "tf32", num_warps=warps, num_stages=stages,
    )


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, config: MoeConfig | None = None,
                  w13_scales: WeightScales | GroupScales | None = None,
                  w2_scales: WeightScales | GroupScales | None = None) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_weights [T, k] (fp32),
    topk_ids [T, k]. Returns sum_j topk_weights[t, j] * expert_{ids[t, j]}(x[t]), [T, H] in x's dtype.
    config: the two GEMMs' tiles, by default moe_config's for the experts' kind. w13 and w2 in fp8 take their scales
    (w13's over its stacked rows: up row n is row I + n of the scale grid too); with GroupScales they are packed
    [E, H / pack, 2I] and [E, I / pack, H] (gate columns, then up columns)."""
    num_tokens, hidden = x.shape
    num_experts = w13.shape[0]
    two_i = w13.shape[2] if isinstance(w13_scales, GroupScales) else w13.shape[1]
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    if num_tokens == 0:
        return torch.zeros_like(x)
    config = config or moe_config(num_pairs, x.dtype, expert_kind(w13_scales, hidden))
    if config[0].block_m != config[1].block_m:
        raise ValueError(f"the two GEMMs share the pairs' layout: BLOCK_M {config[0].block_m} and {config[1].block_m}")
    direct = num_pairs <= pair_bound(DIRECT_MAX_PAIRS, DIRECT_PAIRS_PER_EXPERT, num_experts)
    if direct:  # tile i is pair i: its expert is topk_ids' element i (the kernel reads no sorted ids or count)
        ids = topk_ids.flatten()
        layout = (ids, ids, ids)
    else:
        layout = moe_align(topk_ids, num_experts, config[0].block_m)
    weights = topk_weights.to(torch.float32).contiguous()
    hidden_mid = torch.empty(num_pairs, two_i // 2, dtype=x.dtype, device=x.device)
    moe_gemm(x, w13, w13_scales, hidden_mid, weights, layout, num_pairs, top_k, True, direct, config[0])
    out = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    moe_gemm(hidden_mid, w2, w2_scales, out, weights, layout, num_pairs, 1, False, direct, config[1])
    return sum_pairs(out, top_k)
