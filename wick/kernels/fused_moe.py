"""Fused mixture-of-experts: each token's top-k experts in two grouped GEMMs.

The (token, expert) pairs are sorted by expert and each expert's run is padded to BLOCK_M rows, so a
program's tile of rows belongs to one expert and reads that expert's weights once for all of them
(moe_align, in torch on the device, no host sync). The first GEMM computes a tile's gate and up
columns together from w13 and writes silu(gate) * up; the second multiplies by w2 and by the routing
weight. The top-k partial outputs of each token are then summed by a third kernel (torch's sum over the
middle dim took 4.6 us at one token on an H100). Accumulation is in fp32.

The grid is sized by an upper bound on the padded row count (pairs / BLOCK_M + min(pairs, experts)
tiles); tiles past the real count return at once, so the launch depends on the shapes only. With few
pairs (decode) each pair gets a tile of its own instead and nothing is sorted.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["num_pairs"])
def _moe_gemm_kernel(
    a_ptr, b_ptr, c_ptr, weights_ptr, sorted_ids_ptr, block_expert_ptr, num_padded_ptr,
    N, K, num_pairs,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    A_ROW_DIV: tl.constexpr, GATED: tl.constexpr, MUL_WEIGHT: tl.constexpr, DIRECT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """C[pair, n] = (A[pair // A_ROW_DIV] @ B[expert].T)[n]: GATED reads columns n and N + n of B (gate and
    up) and stores silu(gate) * up; MUL_WEIGHT multiplies by the pair's routing weight. DIRECT: tile i
    holds pair i alone, its expert read from block_expert_ptr[i] (the top-k ids; nothing sorted)."""
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    if DIRECT:
        pairs = pid_m + tl.zeros([BLOCK_M], dtype=tl.int64)
        valid = tl.arange(0, BLOCK_M) == 0
    else:
        if pid_m * BLOCK_M >= tl.load(num_padded_ptr):
            return
        pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        valid = pairs < num_pairs
    expert = tl.load(block_expert_ptr + pid_m).to(tl.int64)
    a_rows = pairs // A_ROW_DIV
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = cols < N
    b_base = b_ptr + expert * stride_be
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    if GATED:
        acc_up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        ks = k0 + tl.arange(0, BLOCK_K)
        k_ok = ks < K
        a = tl.load(a_ptr + a_rows[:, None] * stride_am + ks[None, :] * stride_ak,
                    mask=valid[:, None] & k_ok[None, :], other=0.0)
        b_mask = k_ok[:, None] & col_ok[None, :]
        b = tl.load(b_base + cols[None, :] * stride_bn + ks[:, None] * stride_bk, mask=b_mask, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        if GATED:
            b_up = tl.load(b_base + (cols + N)[None, :] * stride_bn + ks[:, None] * stride_bk, mask=b_mask,
                           other=0.0)
            acc_up = tl.dot(a, b_up, acc_up, input_precision=DOT_PRECISION)
    if GATED:
        acc = acc * tl.sigmoid(acc) * acc_up
    if MUL_WEIGHT:
        acc = acc * tl.load(weights_ptr + pairs, mask=valid, other=0.0)[:, None]
    tl.store(c_ptr + pairs[:, None] * stride_cm + cols[None, :] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=valid[:, None] & col_ok[None, :])


@triton.jit
def _sum_pairs_kernel(partial_ptr, weights_ptr, out_ptr, N, TOP_K: tl.constexpr, K_PAD: tl.constexpr,
                      BLOCK_N: tl.constexpr, WEIGHTED: tl.constexpr):
    """out[token] = sum over j of partial[token * TOP_K + j] (times weights[token * TOP_K + j] where WEIGHTED), in
    fp32."""
    token = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    pairs = tl.arange(0, K_PAD)
    mask = (pairs < TOP_K)[:, None] & (cols < N)[None, :]
    rows = tl.load(partial_ptr + (token * TOP_K + pairs)[:, None] * N + cols[None, :], mask=mask, other=0.0)
    rows = rows.to(tl.float32)
    if WEIGHTED:
        rows *= tl.load(weights_ptr + token * TOP_K + pairs, mask=pairs < TOP_K, other=0.0)[:, None]
    tl.store(out_ptr + token * N + cols, tl.sum(rows, axis=0).to(out_ptr.dtype.element_ty), mask=cols < N)


def sum_pairs(partial: torch.Tensor, top_k: int, weights: torch.Tensor | None = None) -> torch.Tensor:
    """partial [T * top_k, N] (contiguous; row t * top_k + j: token t's j-th expert) -> [T, N], the sum over j, each
    row times weights [T, top_k] (float32) if given."""
    hidden = partial.shape[1]
    summed = torch.empty(partial.shape[0] // top_k, hidden, dtype=partial.dtype, device=partial.device)
    block_n = min(1024, triton.next_power_of_2(hidden))
    _sum_pairs_kernel[(summed.shape[0], triton.cdiv(hidden, block_n))](
        partial, partial if weights is None else weights.contiguous(), summed, hidden, TOP_K=top_k,
        K_PAD=triton.next_power_of_2(top_k), BLOCK_N=block_n, WEIGHTED=weights is not None,
    )
    return summed


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """topk_ids [T, k] -> (sorted_ids, block_expert, num_padded).

    sorted_ids [max_blocks * block_m] int32: the pair indices (t * k + j) grouped by expert, each expert's
    run padded to a multiple of block_m with T * k; block_expert [max_blocks] int32: the expert of each
    tile of block_m rows; num_padded [1] int32: the rows in use (tiles past it are not).
    """
    flat = topk_ids.flatten().to(torch.int64)
    num_pairs = flat.numel()
    max_blocks = num_pairs // block_m + min(num_pairs, num_experts)
    # not bincount: on CUDA it syncs with the host, which a CUDA graph capture cannot
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(0, flat,
                                                                                        torch.ones_like(flat))
    padded = (counts + block_m - 1) // block_m * block_m
    ends = padded.cumsum(0)
    order = flat.argsort(stable=True)
    sorted_experts = flat[order]
    rank = torch.arange(num_pairs, device=flat.device) - (counts.cumsum(0) - counts)[sorted_experts]
    dest = (ends - padded)[sorted_experts] + rank
    sorted_ids = torch.full((max_blocks * block_m,), num_pairs, dtype=torch.int32, device=flat.device)
    sorted_ids[dest] = order.to(torch.int32)
    block_starts = torch.arange(max_blocks, device=flat.device) * block_m
    block_expert = torch.searchsorted(ends, block_starts, right=True).clamp_max(num_experts - 1).to(torch.int32)
    return sorted_ids, block_expert, ends[-1:].to(torch.int32)


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) of both GEMMs by the most (token, expert) pairs they serve
# (benchmarks/kernels/bench_fused_moe.py --sweep); past the last bound, the last config.
MOE_CONFIGS: list[tuple[int, tuple[int, int, int, int, int]]] = [
    (256, (16, 64, 128, 4, 3)),
    (4096, (64, 64, 64, 4, 3)),
    (1 << 62, (128, 128, 64, 8, 3)),
]


# Up to this many (token, expert) pairs each pair takes a tile of its own: no sorting kernels before the GEMMs
# (they cost more than the GEMMs at decode), at the price of reading an expert once per pair that chose it.
DIRECT_MAX_PAIRS = 64


def moe_config(num_pairs: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    config = next(c for bound, c in MOE_CONFIGS if num_pairs <= bound)
    if dtype == torch.float32:  # a float32 tile takes twice the shared memory a step
        block_m, block_n, block_k, warps, stages = config
        return block_m, block_n, min(block_k, 32), warps, stages
    return config


def fused_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                  topk_ids: torch.Tensor, config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """x [T, H]; w13 [E, 2I, H] (gate rows, then up rows); w2 [E, H, I]; topk_weights [T, k] (fp32),
    topk_ids [T, k]. Returns sum_j topk_weights[t, j] * expert_{ids[t, j]}(x[t]), [T, H] in x's dtype.
    config: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), by default from MOE_CONFIGS."""
    num_tokens, hidden = x.shape
    num_experts, two_i, _ = w13.shape
    inter = two_i // 2
    top_k = topk_ids.shape[1]
    num_pairs = num_tokens * top_k
    if num_tokens == 0:
        return torch.zeros_like(x)
    block_m, block_n, block_k, warps, stages = config or moe_config(num_pairs, x.dtype)
    direct = num_pairs <= DIRECT_MAX_PAIRS
    if direct:  # tile i is pair i: its expert is topk_ids' element i (the kernel reads no sorted ids or count)
        block_expert = topk_ids.flatten()
        sorted_ids = num_padded = block_expert
    else:
        sorted_ids, block_expert, num_padded = moe_align(topk_ids, num_experts, block_m)
    num_blocks = block_expert.shape[0]
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    weights = topk_weights.to(torch.float32).contiguous()
    hidden_mid = torch.empty(num_pairs, inter, dtype=x.dtype, device=x.device)
    _moe_gemm_kernel[(num_blocks, triton.cdiv(inter, block_n))](
        x, w13, hidden_mid, weights, sorted_ids, block_expert, num_padded,
        inter, hidden, num_pairs,
        x.stride(0), x.stride(1), w13.stride(0), w13.stride(1), w13.stride(2),
        hidden_mid.stride(0), hidden_mid.stride(1),
        A_ROW_DIV=top_k, GATED=True, MUL_WEIGHT=False, DIRECT=direct,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_PRECISION=precision,
        num_warps=warps, num_stages=stages,
    )
    out = torch.empty(num_pairs, hidden, dtype=x.dtype, device=x.device)
    _moe_gemm_kernel[(num_blocks, triton.cdiv(hidden, block_n))](
        hidden_mid, w2, out, weights, sorted_ids, block_expert, num_padded,
        hidden, inter, num_pairs,
        hidden_mid.stride(0), hidden_mid.stride(1), w2.stride(0), w2.stride(1), w2.stride(2),
        out.stride(0), out.stride(1),
        A_ROW_DIV=1, GATED=False, MUL_WEIGHT=True, DIRECT=direct,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, DOT_PRECISION=precision,
        num_warps=warps, num_stages=stages,
    )
    return sum_pairs(out, top_k)
