"""x @ W for 4- or 8-bit integer weights with group scales and zero points (GPTQ and AWQ, W4A16 / W8A16).

The layout both formats are brought to at load: `qweight` int32 [K / (32 / bits), N], each word holding
consecutive input rows from its lowest bits up; `scales` and `zeros` [groups, N] in the activations'
dtype (zero points as values, not packed); `g_idx` int32 [K], the group of each input row (GPTQ's
act-order checkpoints put rows of one group anywhere). W[k, n] = (q[k, n] - zeros[g, n]) * scales[g, n].
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from wick.kernels.gemv_split import SplitK, store_split_output
from wick.kernels.int8_activations import DP4A, Int8Rows, dp4a, quantize_q8
from wick.kernels.pdl import pdl_options, pdl_prologue


def unpack_rows(qweight: torch.Tensor, bits: int) -> torch.Tensor:
    """int32 [K / pack, N] -> int32 [K, N] of the values, lowest bits first."""
    pack = 32 // bits
    shifts = torch.arange(0, 32, bits, device=qweight.device, dtype=torch.int32)
    values = (qweight.unsqueeze(1) >> shifts.reshape(1, pack, 1)) & ((1 << bits) - 1)
    return values.reshape(-1, qweight.shape[1])


def pack_rows(values: torch.Tensor, bits: int) -> torch.Tensor:
    """int [K, N] -> int32 [K / pack, N]: the inverse of unpack_rows."""
    pack = 32 // bits
    shifts = torch.arange(0, 32, bits, device=values.device, dtype=torch.int64)
    words = (values.to(torch.int64).reshape(-1, pack, values.shape[1]) << shifts.reshape(1, pack, 1)).sum(1)
    return (words - ((words >> 31) << 32)).to(torch.int32)  # two's complement of the uint32


def wna16_dequantize(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor,
                     bits: int) -> torch.Tensor:
    """The reference: W [K, N] in the scales' dtype."""
    q = unpack_rows(qweight, bits).to(scales.dtype)
    groups = g_idx.long()
    return (q - zeros[groups]) * scales[groups]


@triton.jit
def load_unpacked(words_ptr, k0, cols, n_mask, stride_w, stride_n, K, BITS: tl.constexpr, BLOCK_K: tl.constexpr,
                  BLOCK_N: tl.constexpr):
    """int32 values [BLOCK_K, BLOCK_N] of input rows k0 .. k0 + BLOCK_K (of K, 32 / BITS to a word) and columns
    `cols`: each word loaded once and its fields unpacked into consecutive rows (loading a word for each of its rows
    took 1.3-1.6x as long on an H100). Rows past K read 0."""
    PACK: tl.constexpr = 32 // BITS
    w_rows = k0 // PACK + tl.arange(0, BLOCK_K // PACK)
    words = tl.load(words_ptr + w_rows.to(tl.int64)[:, None] * stride_w + cols[None, :] * stride_n,
                    mask=(w_rows * PACK < K)[:, None] & n_mask[None, :], other=0)
    fields = (words[:, None, :] >> (tl.arange(0, PACK) * BITS)[None, :, None]) & ((1 << BITS) - 1)
    return tl.reshape(fields, [BLOCK_K, BLOCK_N])


@triton.jit
def _wna16_dequantize_kernel(qweight_ptr, scales_ptr, zeros_ptr, g_idx_ptr, out_ptr, N, K, BITS: tl.constexpr,
                             BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """W's [BLOCK_K, BLOCK_N] tile from its words, each loaded once and its fields unpacked into consecutive rows."""
    k0 = tl.program_id(0) * BLOCK_K
    k = k0 + tl.arange(0, BLOCK_K)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    k_mask = k < K
    n_mask = cols < N
    q = load_unpacked(qweight_ptr, k0, cols, n_mask, N, 1, K, BITS, BLOCK_K, BLOCK_N).to(tl.float32)
    mask = k_mask[:, None] & n_mask[None, :]
    offsets = tl.load(g_idx_ptr + k, mask=k_mask, other=0).to(tl.int64)[:, None] * N + cols[None, :]
    zero = tl.load(zeros_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    scale = tl.load(scales_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + k.to(tl.int64)[:, None] * N + cols[None, :], ((q - zero) * scale).to(out_ptr.dtype.element_ty),
             mask=mask)


def wna16_dequantize_triton(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, g_idx: torch.Tensor,
                            bits: int) -> torch.Tensor:
    """wna16_dequantize in one kernel on a GPU: W [K, N] in the scales' dtype."""
    k, n = g_idx.shape[0], qweight.shape[1]
    out = torch.empty(k, n, dtype=scales.dtype, device=qweight.device)
    _wna16_dequantize_kernel[(triton.cdiv(k, 64), triton.cdiv(n, 128))](qweight, scales, zeros, g_idx, out, n, k,
                                                                        BITS=bits, BLOCK_K=64, BLOCK_N=128)
    return out


@triton.jit(do_not_specialize=["M"])
def _wna16_kernel(
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, g_idx_ptr, out_ptr, M, N, K, stride_xm, stride_om,
    BITS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    GEMV: tl.constexpr, GROUP: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    """x rows against BLOCK_N columns of W, a BLOCK_K step of rows at a time: each word loaded once and its fields
    unpacked into consecutive rows. GROUP (a multiple of BLOCK_K): row k is in group k // GROUP, so a step's values
    less their zero points go into the product and its columns' scales multiply it once; 0: each row's group from
    g_idx (act-order), each value scaled before the product. GEMV: one row of x a program, no tl.dot."""
    pid_m = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    ks = tl.arange(0, BLOCK_K)
    if GEMV:
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    else:
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + ks
        k_mask = k < K
        q = load_unpacked(qweight_ptr, k0, cols, n_mask, N, 1, K, BITS, BLOCK_K, BLOCK_N).to(tl.float32)
        if GROUP:
            offsets = (k0 // GROUP) * N + cols
            scale = tl.load(scales_ptr + offsets, mask=n_mask, other=0.0).to(tl.float32)
            w = q - tl.load(zeros_ptr + offsets, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        else:
            group = tl.load(g_idx_ptr + k, mask=k_mask, other=0).to(tl.int64)
            offsets = group[:, None] * N + cols[None, :]
            mask = k_mask[:, None] & n_mask[None, :]
            zero = tl.load(zeros_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
            w = (q - zero) * tl.load(scales_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        if GEMV:
            x = tl.load(x_ptr + pid_m.to(tl.int64) * stride_xm + k, mask=k_mask, other=0.0).to(tl.float32)
            step = tl.sum(w * x[:, None], axis=0)
        else:
            x = tl.load(x_ptr + rows.to(tl.int64)[:, None] * stride_xm + k[None, :],
                        mask=(rows < M)[:, None] & k_mask[None, :], other=0.0)
            # (q - zero): exact in bf16
            step = tl.dot(x, w.to(x_ptr.dtype.element_ty), input_precision=DOT_PRECISION, out_dtype=tl.float32)
        if GROUP:
            step *= scale
        acc += step
    if GEMV:
        tl.store(out_ptr + pid_m.to(tl.int64) * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=n_mask)
    else:
        out = out_ptr + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(rows < M)[:, None] & n_mask[None, :])


@triton.jit
def _expert_weights(experts_ptr, m, qweight_ptr, scales_ptr, zeros_ptr, stride_qe, stride_se):
    """The words, scales and zero points of expert experts[m] of stacked ones (zero points strided as the scales)."""
    expert = tl.load(experts_ptr + m).to(tl.int64)
    return qweight_ptr + expert * stride_qe, scales_ptr + expert * stride_se, zeros_ptr + expert * stride_se


@triton.jit
def _wna16_gemv_kernel(
    x_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, experts_ptr, N, K, GROUP, stride_xm, stride_om, stride_qe,
    stride_se,
    BITS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, ONE_GROUP: tl.constexpr,
    X_ROW_DIV: tl.constexpr, EXPERTS: tl.constexpr,
):
    """Output row m against BLOCK_N columns of W whose groups are contiguous (row k in group k // GROUP).
    Every step works on the [words, columns] tile as loaded: field by field, each word's fields are summed
    against x before the word's group scale and zero point apply (once per step where ONE_GROUP: the step
    lies in one group); the tile's rows are summed once at the end. Row m reads row m // X_ROW_DIV of x;
    EXPERTS: W, its scales and zero points those of expert experts[m] of stacked ones (MoE experts, a (token,
    expert) pair a row)."""
    PACK: tl.constexpr = 32 // BITS
    WORDS: tl.constexpr = BLOCK_K // PACK
    m = tl.program_id(0)
    if EXPERTS:
        qweight_ptr, scales_ptr, zeros_ptr = _expert_weights(experts_ptr, m, qweight_ptr, scales_ptr, zeros_ptr,
                                                             stride_qe, stride_se)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    word_rows = tl.arange(0, WORDS)
    x_row = x_ptr + (m // X_ROW_DIV).to(tl.int64) * stride_xm
    acc = tl.zeros([WORDS, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        w_rows = k0 // PACK + word_rows
        w_mask = w_rows < K // PACK
        mask = w_mask[:, None] & n_mask[None, :]
        words = tl.load(qweight_ptr + w_rows.to(tl.int64)[:, None] * N + cols[None, :], mask=mask, other=0)
        dot = tl.zeros([WORDS, BLOCK_N], dtype=tl.float32)
        x_sum = tl.zeros([WORDS], dtype=tl.float32)
        for field in tl.static_range(PACK):
            x = tl.load(x_row + w_rows * PACK + field, mask=w_mask, other=0.0).to(tl.float32)
            q = ((words >> (field * BITS)) & ((1 << BITS) - 1)) | 0x4B000000
            dot += (q.to(tl.float32, bitcast=True) - 8388608.0) * x[:, None]
            x_sum += x
        if ONE_GROUP:
            offsets = (k0 // GROUP) * N + cols
            scale = tl.load(scales_ptr + offsets, mask=n_mask, other=0.0).to(tl.float32)[None, :]
            zero = tl.load(zeros_ptr + offsets, mask=n_mask, other=0.0).to(tl.float32)[None, :]
        else:
            offsets = ((w_rows * PACK) // GROUP).to(tl.int64)[:, None] * N + cols[None, :]
            scale = tl.load(scales_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
            zero = tl.load(zeros_ptr + offsets, mask=mask, other=0.0).to(tl.float32)
        acc += scale * (dot - zero * x_sum[:, None])
    out = tl.sum(acc, axis=0)
    tl.store(out_ptr + m.to(tl.int64) * stride_om + cols, out.to(out_ptr.dtype.element_ty), mask=n_mask)


@triton.jit
def _w4a8_weights(qweight_ptr, scales_ptr, zeros_ptr, k0, k_end, word_rows, cols, n_mask, N, GROUP,
                  TO_END: tl.constexpr):
    """The step from input row k0's [words, columns] tile of W and its group's scales and zero points; where TO_END,
    nothing where k0 is at k_end."""
    w_rows = k0 // 8 + word_rows
    w_mask = n_mask[None, :]
    group_mask = n_mask
    if TO_END:
        w_mask &= (w_rows < k_end // 8)[:, None]
        group_mask &= tl.zeros_like(cols) + k0 < k_end
    words = tl.load(qweight_ptr + w_rows.to(tl.int64)[:, None] * N + cols[None, :], mask=w_mask, other=0)
    offsets = (k0 // GROUP) * N + cols
    scale = tl.load(scales_ptr + offsets, mask=group_mask, other=0.0)
    zero = tl.load(zeros_ptr + offsets, mask=group_mask, other=0.0)
    return words, scale, zero


@triton.jit
def _w4a8_gemv_kernel(
    xq_ptr, xd_ptr, xs_ptr, qweight_ptr, scales_ptr, zeros_ptr, out_ptr, work_ptr, counts_ptr, experts_ptr, M, N, K,
    GROUP, SPLIT_STEPS, SPLITS, stride_om, stride_qe, stride_se,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT: tl.constexpr, DP4A: tl.constexpr, X_ROW_DIV: tl.constexpr,
    EXPERTS: tl.constexpr, PDL: tl.constexpr,
):
    """One row of x, rounded to int8 and interleaved by quantize_q8, against BLOCK_N columns of 4-bit W whose
    groups are contiguous and hold whole steps (GROUP a multiple of BLOCK_K). A word's low nibbles (its even
    input rows) meet x's four even codes in one dp4a, its high nibbles the odd ones in another; a word's
    integer sum takes its run's scale of x, and the step's group scale and zero point apply once. Each step
    issues the next step's loads of W before it sums its own, so two steps' weights are in flight; the first step's
    load before the PDL wait (but for EXPERTS, whose ids come from the kernel before). Where SPLIT,
    program (.., .., s) takes SPLIT_STEPS steps from step s * SPLIT_STEPS (gemv_split.py). Output row m reads row
    m // X_ROW_DIV of x; EXPERTS: W, its scales and zero points those of expert experts[m] of stacked ones."""
    WORDS: tl.constexpr = BLOCK_K // 8
    m = tl.program_id(0)
    if EXPERTS:
        pdl_prologue(PDL)
        qweight_ptr, scales_ptr, zeros_ptr = _expert_weights(experts_ptr, m, qweight_ptr, scales_ptr, zeros_ptr,
                                                             stride_qe, stride_se)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = cols < N
    word_rows = tl.arange(0, WORDS)
    x_row = (m // X_ROW_DIV).to(tl.int64)
    x_words = xq_ptr.to(tl.pointer_type(tl.int32)) + x_row * (K // 4)
    runs = x_row * (K // 32)
    step_runs = tl.arange(0, BLOCK_K // 32)
    acc = tl.zeros([WORDS, BLOCK_N], dtype=tl.float32)
    acc_zero = tl.zeros([BLOCK_N], dtype=tl.float32)
    k_begin = tl.program_id(2) * SPLIT_STEPS * BLOCK_K
    k_end = tl.minimum(K, k_begin + SPLIT_STEPS * BLOCK_K)
    words, scale, zero = _w4a8_weights(qweight_ptr, scales_ptr, zeros_ptr, k_begin, k_end, word_rows, cols, n_mask,
                                       N, GROUP, False)
    if not EXPERTS:
        pdl_prologue(PDL)
    for k0 in range(k_begin, k_end, BLOCK_K):
        next_words, next_scale, next_zero = _w4a8_weights(qweight_ptr, scales_ptr, zeros_ptr, k0 + BLOCK_K, k_end,
                                                          word_rows, cols, n_mask, N, GROUP, True)
        w_rows = k0 // 8 + word_rows
        x_even = tl.load(x_words + 2 * w_rows)[:, None]
        x_odd = tl.load(x_words + 2 * w_rows + 1)[:, None]
        dot = dp4a(words & 0x0F0F0F0F, x_even, DP4A) + dp4a((words >> 4) & 0x0F0F0F0F, x_odd, DP4A)
        x_scale = tl.load(xd_ptr + runs + w_rows // 4)[:, None]
        group_scale = scale.to(tl.float32)
        acc += group_scale[None, :] * (dot.to(tl.float32) * x_scale)
        acc_zero += group_scale * zero.to(tl.float32) * tl.sum(tl.load(xs_ptr + runs + k0 // 32 + step_runs))
        words, scale, zero = next_words, next_scale, next_zero
    store_split_output(tl.sum(acc, axis=0) - acc_zero, m, cols, n_mask, out_ptr, stride_om,
                       work_ptr, counts_ptr, M, N, SPLITS, SPLIT)


GEMV_MAX_ROWS = 8
# Columns per program, input rows per step, warps, and the warps an SM that splitting K of the int8 form aims
# at, of the contiguous-group GEMV. With two steps' loads in flight, 24 warps an SM took Llama-3.1-8B's layers in
# 61.2 us against 65.4 at 32 (and 63.8 for one step in flight at 32), Qwen3-30B-A3B's experts' in 20.9 against 20.8
# (22.3) on an H200 (docs/benchmarks.md, session 39).
WNA16_GEMV_CONFIG = (32, 128, 2, 24)


# (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages) of the tile kernel by the most rows they serve; past the last, the last.
# (`benchmarks/kernels/bench_quant_gemm.py --qtype GPTQ --sweep`, Llama-3.1-8B's layers on an H100).
WNA16_TILE_CONFIGS: list[tuple[int, tuple[int, int, int, int, int]]] = [
    (16, (16, 64, 128, 8, 3)),
    (32, (32, 64, 128, 8, 3)),
    (1 << 62, (64, 64, 128, 4, 3)),
]


def wna16_matmul(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 g_idx: torch.Tensor, bits: int, group: int | None = None,
                 gemv_config: tuple[int, int, int, int] | None = None, split_k: int | None = None,
                 tile_config: tuple[int, int, int, int, int] | None = None) -> torch.Tensor:
    """x [..., K] @ W [K, N] in x's dtype, W dequantized inside the kernel. group: set where row k is in
    group k // group (g_idx is then not read). gemv_config: (columns, rows a step, warps) of that GEMV (and the
    warps an SM that splitting K aims at) and split_k the splits of K of its int8 form; tile_config: (BLOCK_M,
    BLOCK_N, BLOCK_K, warps, stages) of the tile kernel past GEMV_MAX_ROWS; for benchmarks and tests, None picks
    them."""
    k, n = g_idx.shape[0], qweight.shape[1]
    x2 = x.reshape(-1, k)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out.reshape(*x.shape[:-1], n)
    if m <= GEMV_MAX_ROWS and group is not None:
        _gemv(x2, qweight, scales, zeros, bits, group, out, None, 1, gemv_config or WNA16_GEMV_CONFIG, split_k)
        return out.reshape(*x.shape[:-1], n)
    gemv = m <= GEMV_MAX_ROWS
    block_m, block_n, block_k, warps, stages = (1, 64, 128, 4, 3) if gemv else tile_config or next(
        c for rows, c in WNA16_TILE_CONFIGS if m <= rows)
    if not gemv and (group is None or group % block_k or x.dtype == torch.float32):
        # g_idx gathers a scale and a zero point for every value; a float32 tile takes twice the shared memory
        block_k = min(block_k, 32)
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _wna16_kernel[grid](x2, qweight, scales, zeros, g_idx, out, m, n, k, x2.stride(0), out.stride(0),
                        BITS=bits, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GEMV=gemv,
                        GROUP=0 if group is None or group % block_k else group,
                        DOT_PRECISION="ieee" if x.dtype == torch.float32 else "tf32", num_warps=warps,
                        num_stages=stages)
    return out.reshape(*x.shape[:-1], n)


def takes_int8_activations(bits: int, group: int, k: int, block_k: int = WNA16_GEMV_CONFIG[1]) -> bool:
    """Whether the GEMV over W of `bits` in contiguous groups of `group` of k rows rounds x to int8 (steps of
    gcd(block_k, group) rows lie in one group each, whole 32-row runs of x, and end at k)."""
    step = math.gcd(block_k, group)
    return bits == 4 and step % 32 == 0 and k % step == 0


def _gemv(x2: torch.Tensor | Int8Rows, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
          group: int, out: torch.Tensor, experts: torch.Tensor | None, x_row_div: int,
          config: tuple[int, int, int, int], split_k: int | None) -> None:
    """out[m] = x2[m // x_row_div] @ W (of expert experts[m] of stacked [E, ...] ones where experts is given), W's
    groups contiguous: 4-bit W against x rounded to int8 where the groups hold whole 32-row runs (x2 may come rounded,
    quantize_q8's interleaved), else in floats."""
    m, (n, k) = out.shape[0], (out.shape[1], (x2.q if isinstance(x2, Int8Rows) else x2).shape[1])
    block_n, block_k, warps, split_warps = config
    stacked = experts is not None
    expert_strides = (qweight.stride(0), scales.stride(0)) if stacked else (0, 0)
    step = math.gcd(block_k, group)
    grid = (m, triton.cdiv(n, block_n))
    if takes_int8_activations(bits, group, k, block_k):
        xq, xd, xs = x2 if isinstance(x2, Int8Rows) else quantize_q8(x2, interleave=True)
        split = SplitK(k // step, m * grid[1], warps, split_warps, out, split_k)
        _w4a8_gemv_kernel[(*grid, split.splits)](
            xq, xd, xs, qweight, scales, zeros, out, split.work, split.counts, experts if stacked else out, m, n, k,
            group, split.steps, split.splits, out.stride(0), *expert_strides, BLOCK_N=block_n, BLOCK_K=step,
            SPLIT=split.splits > 1, DP4A=DP4A, X_ROW_DIV=x_row_div, EXPERTS=stacked, num_warps=warps,
            **pdl_options(xq))
        return
    if isinstance(x2, Int8Rows):
        raise ValueError(f"rows rounded to int8 reach a {bits}-bit GEMV of groups of {group} that takes floats")
    _wna16_gemv_kernel[grid](
        x2, qweight, scales, zeros, out, experts if stacked else out, n, k, group, x2.stride(0), out.stride(0),
        *expert_strides, BITS=bits, BLOCK_N=block_n, BLOCK_K=block_k, ONE_GROUP=group % block_k == 0,
        X_ROW_DIV=x_row_div, EXPERTS=stacked, num_warps=warps)


def wna16_int8_rows_matmul(x: Int8Rows, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, bits: int,
                           group: int, dtype: torch.dtype) -> torch.Tensor:
    """x's rows (at most GEMV_MAX_ROWS), already rounded to int8 (quantize_q8's, interleaved), @ W -> [M, N] in
    `dtype` by the int8 GEMV, where takes_int8_activations(bits, group, K)."""
    out = torch.empty(x.q.shape[0], qweight.shape[1], dtype=dtype, device=x.q.device)
    _gemv(x, qweight, scales, zeros, bits, group, out, None, 1, WNA16_GEMV_CONFIG, None)
    return out


# (columns, input rows a step, warps, warps an SM that splitting K aims at) of the expert GEMV (WNA16_GEMV_CONFIG's
# measurement).
EXPERT_GEMV_CONFIG = (32, 128, 2, 24)


def expert_takes_int8_rows(bits: int, group: int, k: int) -> bool:
    """Whether wna16_expert_gemv over k rows of W takes x rounded to int8 (then also as Int8Rows, interleaved)."""
    return takes_int8_activations(bits, group, k, EXPERT_GEMV_CONFIG[1])


def wna16_expert_gemv(x: torch.Tensor | Int8Rows, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                      bits: int, group: int, experts: torch.Tensor, x_row_div: int,
                      gemv_config: tuple[int, int, int, int] | None = None,
                      dtype: torch.dtype | None = None, split_k: int | None = None) -> torch.Tensor:
    """out [P, N]: row p = x[p // x_row_div] @ W_{experts[p]} for experts `qweight` [E, K / (32 / bits), N] with
    contiguous groups of `group` rows (a multiple of 32 / bits), scales and zeros [E, ceil(K / group), N]. x may
    come rounded to int8 (quantize_q8's, interleaved) where expert_takes_int8_rows, with `dtype` the output's.
    split_k: the splits of K of the int8 form, for tests; None picks them."""
    _, words, n = qweight.shape
    rounded = isinstance(x, Int8Rows)
    x2 = x if rounded else x.reshape(-1, words * (32 // bits)).contiguous()
    out = torch.empty(experts.numel(), n, dtype=dtype if rounded else x.dtype, device=qweight.device)
    if out.shape[0]:
        _gemv(x2, qweight, scales, zeros, bits, group, out, experts, x_row_div, gemv_config or EXPERT_GEMV_CONFIG,
              split_k)
    return out
