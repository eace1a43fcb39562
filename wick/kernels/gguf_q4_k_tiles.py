"""Q4_K weights against 9 to a few hundred rows of x: tiles of out^T = W x^T, each program decoding its tile of
W from the packed blocks in registers for tl.dot (W the wide operand, the rows of x the narrow one), so the 4-bit
bytes are read once a tile of rows instead of W being decoded whole for cuBLAS. Over (token, expert) pairs sorted
by expert (moe_align's tiles) the same kernel runs a GGUF file's experts.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from wick.kernels.gemv_split import SplitK, store_split_output
from wick.kernels.gguf_int8_gemv import k_scale_min_words, q4_k_head

# Rows of x up to which Q4_K runs the tile kernel; past them W is dequantized whole for cuBLAS.
Q4_K_TILE_MAX_ROWS = 256
# (BLOCK_M, BLOCK_N, PAIRS, warps, stages) of the Q4_K tile kernel by the most rows they serve
# (benchmarks/kernels/bench_quant_gemm.py --sweep at 16, 64 and 256 rows on an H100); past the last, the last.
Q4_K_TILE_CONFIGS: list[tuple[int, tuple[int, int, int, int, int]]] = [
    (16, (16, 64, 2, 4, 3)),
    (32, (32, 64, 2, 8, 3)),
    (64, (64, 128, 2, 8, 3)),
    (128, (128, 64, 2, 8, 3)),
    (1 << 62, (256, 64, 2, 8, 3)),
]
# Warps an SM that splitting K of the tile kernel aims at.
Q4_K_TILE_SPLIT_WARPS = 16


@triton.jit(do_not_specialize=["M"])
def _q4_k_tile_kernel(x_ptr, w_ptr, out_ptr, work_ptr, counts_ptr, sorted_ptr, experts_ptr, padded_ptr, expert_bytes,
                      M, N, K, stride_xm, row_words, stride_om, SPLIT_PAIRS, SPLITS,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PAIRS: tl.constexpr, SPLIT: tl.constexpr,
                      DOT_PRECISION: tl.constexpr, SORTED: tl.constexpr, X_ROW_DIV: tl.constexpr):
    """out^T tile [BLOCK_N, BLOCK_M] = W tile @ x^T for Q4_K W, PAIRS pairs of sub-blocks (64 columns) a step:
    byte 32p + l of a block's codes holds element 64p + l in its low nibble and 64p + 32 + l in its high one.
    The step's codes are read as [BLOCK_N, PAIRS, 2, 32] (each byte twice, once a nibble) so that the decoded
    tile is in column order and x^T is read contiguously. W is the wide operand, the few rows of x the narrow
    one. Where SPLIT, program (.., .., s) takes SPLIT_PAIRS pairs from pair s * SPLIT_PAIRS (gemv_split.py).
    SORTED: the output rows are M (token, expert) pairs, tile i's the sorted pairs sorted_ptr[i * BLOCK_M + ...]
    of expert experts_ptr[i] (moe_align's layout, M for padding; tiles from padded_ptr[0] / BLOCK_M on have none),
    W that expert's (expert_bytes apart) and x's row a pair's token (pair // X_ROW_DIV)."""
    if SORTED:
        if tl.program_id(0) * BLOCK_M >= tl.load(padded_ptr):
            return
        rows = tl.load(sorted_ptr + tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        w_ptr += tl.load(experts_ptr + tl.program_id(0)).to(tl.int64) * expert_bytes
    else:
        rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    words = w_ptr.to(tl.pointer_type(tl.int32))
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    m_mask = rows < M
    # Rows of W past N read row 0 and are not stored.
    row_base = tl.where(n_mask, cols, 0).to(tl.int64) * row_words
    p = tl.arange(0, PAIRS)[None, :, None]
    half = tl.arange(0, 2)[None, None, :]
    lane = tl.arange(0, 32)[None, None, None, :]
    ks = tl.arange(0, 64 * PAIRS)
    x_rows = x_ptr + (tl.where(m_mask, rows, 0) // X_ROW_DIV).to(tl.int64)[None, :] * stride_xm
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    p_begin = tl.program_id(2) * SPLIT_PAIRS
    for p0 in range(p_begin, tl.minimum(K // 64, p_begin + SPLIT_PAIRS), PAIRS):
        block = row_base + (p0 // 4) * 36
        d, dmin, a, m, c = q4_k_head(words, block)
        d, dmin = d[:, None, None], dmin[:, None, None]
        scale, minimum = k_scale_min_words(a[:, None, None], m[:, None, None], c[:, None, None],
                                           2 * (p0 % 4 + p) + half)
        codes = tl.load((w_ptr + block * 4 + 16 + (p0 % 4) * 32)[:, None, None, None] + 32 * p[:, :, :, None]
                        + lane).to(tl.int32)
        # A code q in the float32 mantissa's top bits reads 1 + q / 16: no integer-to-float conversion, which
        # runs at an eighth of the rate of a multiply-add. w = (1 + q / 16) * 16 d s - (16 d s + dmin m).
        ds16 = (16.0 * d * scale)[:, :, :, None]
        q = (((codes >> (4 * half[:, :, :, None])) & 15) << 19 | 0x3F800000).to(tl.float32, bitcast=True)
        w = q * ds16 - (ds16 + (dmin * minimum)[:, :, :, None])
        w = tl.reshape(w, (BLOCK_N, 64 * PAIRS)).to(x_ptr.dtype.element_ty)
        xt = tl.load(x_rows + (p0 * 64 + ks)[:, None], mask=m_mask[None, :], other=0.0)
        acc = tl.dot(w, xt, acc, input_precision=DOT_PRECISION, out_dtype=tl.float32)
    store_split_output(acc, rows[None, :], cols[:, None], n_mask[:, None] & m_mask[None, :], out_ptr, stride_om,
                       work_ptr, counts_ptr, M, N, SPLITS, SPLIT)


def _q4_k_tile_config(rows: int, dtype: torch.dtype) -> tuple[int, int, int, int, int]:
    """The tile of Q4_K_TILE_CONFIGS for `rows` rows of x; float32 x takes at most 32 rows a tile (its tiles of x
    take twice the shared memory: 256 rows needed 305 KB on an H100, which has 227)."""
    block_m, block_n, pairs, warps, stages = next(c for bound, c in Q4_K_TILE_CONFIGS if rows <= bound)
    if dtype == torch.float32:
        block_m = min(block_m, 32)
    return block_m, block_n, pairs, warps, stages


def expert_tile_rows(num_pairs: int, num_experts: int, dtype: torch.dtype) -> int:
    """The row tile of gguf_expert_matmul for num_pairs (token, expert) pairs over num_experts experts and x of
    `dtype` (moe_align's block_m): the tile for the pairs an expert gets on average, at most 128."""
    return _q4_k_tile_config(min(128, -(-num_pairs // num_experts)), dtype)[0]


def gguf_expert_matmul(x: torch.Tensor, data: torch.Tensor, k: int, sorted_ids: torch.Tensor,
                       block_expert: torch.Tensor, num_padded: torch.Tensor, block_m: int, num_pairs: int,
                       x_row_div: int, split_k: int | None = None) -> torch.Tensor:
    """out [num_pairs, N]: row p = x[p // x_row_div] @ W_e^T for Q4_K experts `data` [E, N, row bytes] over k
    columns, each pair p in the tiles of moe_align(ids, E, block_m) (e = its expert); block_m from
    expert_tile_rows. split_k: the splits of K, for tests; None picks them."""
    if sorted_ids.numel() != block_expert.numel() * block_m:
        raise ValueError(f"the sorted pairs are not in tiles of {block_m} rows")
    out = torch.empty(num_pairs, data.shape[1], dtype=x.dtype, device=x.device)
    _launch(x.reshape(-1, k).contiguous(), data, out, _q4_k_tile_config(block_m, x.dtype), split_k,
            (sorted_ids, block_expert, num_padded), x_row_div)
    return out


def q4_k_tile_matmul(x: torch.Tensor, data: torch.Tensor, out: torch.Tensor,
                     tile_config: tuple[int, int, int, int, int] | None, split_k: int | None) -> None:
    """out [M, N] = x [M, K] @ W^T for Q4_K W `data` [N, row bytes] (4-byte aligned rows). tile_config: (BLOCK_M,
    BLOCK_N, PAIRS, warps, stages) and split_k the splits of K, for benchmarks and tests; None picks them."""
    _launch(x, data, out, tile_config or _q4_k_tile_config(x.shape[0], x.dtype), split_k, None, 1)


def _launch(x: torch.Tensor, data: torch.Tensor, out: torch.Tensor, config: tuple[int, int, int, int, int],
            split_k: int | None, sorted_pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
            x_row_div: int) -> None:
    """The tile kernel over out's rows, or with sorted_pairs (moe_align's sorted ids, each tile's expert, the rows
    in use) over (token, expert) pairs of experts `data` [E, N, row bytes]."""
    block_m, block_n, pairs, warps, stages = config
    m, n = out.shape
    k = x.shape[1]
    grid = (triton.cdiv(m, block_m) if sorted_pairs is None else sorted_pairs[1].shape[0], triton.cdiv(n, block_n))
    split = SplitK(k // 64 // pairs, grid[0] * grid[1], warps, Q4_K_TILE_SPLIT_WARPS, out, split_k)
    _q4_k_tile_kernel[(*grid, split.splits)](
        x, data, out, split.work, split.counts, *(sorted_pairs or (out, out, out)),
        0 if sorted_pairs is None else data.stride(0), m, n, k, x.stride(0), data.stride(-2) // 4, out.stride(0),
        split.steps * pairs, split.splits, BLOCK_M=block_m, BLOCK_N=block_n, PAIRS=pairs, SPLIT=split.splits > 1,
        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", SORTED=sorted_pairs is not None,
        X_ROW_DIV=x_row_div, num_warps=warps, num_stages=stages)
