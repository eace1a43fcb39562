"""One paged attention kernel for prefill, chunked prefill over cached context, and decode.

A program owns one KV head and a tile of BLOCK_M = BLOCK_Q * GROUP_PAD rows: BLOCK_Q query tokens of
one request times the GROUP query heads sharing that KV head (padded to a power of two), so each K/V
tile read through the block table serves every query head of the group. A request's queries are its
last query_len context positions (causal). Softmax is online, in fp32, in base 2.

Split-KV: with num_splits > 1 each program covers one slice of its tile's keys and writes an
unnormalised partial result with its running max and sum; split_combine.py merges them. The split count
is fixed by max_seq_len (a CUDA graph's bound); the splits past a shorter context's keys end at once, and the
combine reads only the splits that had keys.

The launch reads no device values on the host: the grid depends only on q.shape[0], the number of
requests, max_query_len and (through the split choice) max_seq_len, so a decode step can be captured
in a CUDA graph as long as those stay fixed between capture and replay (see paged_attention()).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl

from wick.kernels.kv_cache_write import FP8_DTYPES, to_cache_values
from wick.kernels.pdl import pdl_options, pdl_prologue, uses_pdl
from wick.kernels.rotary import rotated_rows
from wick.kernels.split_combine import SplitPartials, combine_splits

if TYPE_CHECKING:
    from wick.layers.rotary import RopeInputs

LOG2E = 1.4426950408889634
# Keys a split covers at least. At batch 1 an H100 runs a 640-key context in 19.0 us with 2 splits and in
# 8.9-9.9 with 8-16 (Gemma 3's 256-dim heads; 11.2 against 7.8 us for 128-dim ones), and splitting pays from
# 256 keys on (bench_paged_attention.py --splits-sweep); below 64 keys a split is less than one key tile.
MIN_SPLIT_TOKENS = 64
MAX_SPLITS = 64
# A decode step of at least this many rows is several waves of programs: it takes its requests longest context first
# (the short ones fill the last wave) and pipelines two key tiles, not three. Qwen3-0.6B's heads on an H200, contexts
# uniform in [200, 2048] (bench_paged_attention.py --mixed-sweep): 293.8 -> 272.3 us at batch 256, 162.0 -> 152.4 at
# 128, 88.3 -> 82.6 at 64; at batch 32 neither paid.
LARGE_DECODE = 64


@triton.jit
def _attend_tile(
    acc, l_i, m_i, q, k_ptr, v_ptr, table_ptr, start_n, pos, kv_end, qk_scale, window, soft_cap,
    stride_kb, stride_ks, stride_vb, stride_vs,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    MASKED: tl.constexpr, WINDOWED: tl.constexpr, SOFT_CAP: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    keys = start_n + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, HEAD_DIM)
    in_range = keys < kv_end
    if MASKED:
        page = tl.load(table_ptr + keys // BLOCK_SIZE, mask=in_range, other=0).to(tl.int64)
    else:
        page = tl.load(table_ptr + keys // BLOCK_SIZE).to(tl.int64)
    slot = (keys % BLOCK_SIZE).to(tl.int64)
    k = tl.load(k_ptr + (page * stride_kb + slot * stride_ks)[:, None] + dims[None, :]).to(q.dtype)
    qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
    if SOFT_CAP:
        # qk_scale is the softmax scale here: cap * tanh(s / cap), tanh(x) = 2 sigmoid(2x) - 1, then base 2
        qk = soft_cap * (2.0 / (1.0 + tl.exp(-2.0 * (qk * qk_scale / soft_cap))) - 1.0) * 1.4426950408889634
    else:
        qk = qk * qk_scale
    if WINDOWED:
        qk = tl.where(keys[None, :] > pos[:, None] - window, qk, float("-inf"))
    v_ptrs = v_ptr + (page * stride_vb + slot * stride_vs)[:, None] + dims[None, :]
    # unwritten (or, past a window, freed) cache memory may hold NaN, which a zero probability would not cancel
    if WINDOWED:
        v_valid = keys > tl.min(pos, 0) - window
        if MASKED:
            v_valid &= in_range
    if MASKED:
        qk = tl.where(keys[None, :] <= pos[:, None], qk, float("-inf"))
    if WINDOWED:
        v = tl.load(v_ptrs, mask=v_valid[:, None], other=0.0).to(q.dtype)
    elif MASKED:
        v = tl.load(v_ptrs, mask=in_range[:, None], other=0.0).to(q.dtype)
    else:
        v = tl.load(v_ptrs).to(q.dtype)
    m_new = tl.maximum(m_i, tl.max(qk, 1))
    p = tl.exp2(qk - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
    return acc, l_i, m_new


@triton.jit
def _prefetch_l2(ptrs):
    """Asks L2 for the 128-byte lines at ptrs, without waiting for them."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [ptrs], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_tile(k_ptr, v_ptr, table_ptr, lo, hi, stride_kb, stride_ks, stride_vb, stride_vs,
                   BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, CACHE_LINE: tl.constexpr):
    """_prefetch_l2 over the keys and values of keys [lo, min(lo + BLOCK_N, hi)), CACHE_LINE of a head's elements a
    line."""
    keys = lo + tl.arange(0, BLOCK_N)
    page = tl.load(table_ptr + keys // BLOCK_SIZE, mask=keys < hi, other=0).to(tl.int64)
    slot = (keys % BLOCK_SIZE).to(tl.int64)
    lines = (tl.arange(0, HEAD_DIM // CACHE_LINE) * CACHE_LINE)[None, :]
    _prefetch_l2(k_ptr + (page * stride_kb + slot * stride_ks)[:, None] + lines)
    _prefetch_l2(v_ptr + (page * stride_vb + slot * stride_vs)[:, None] + lines)


@triton.jit(do_not_specialize=["num_reqs", "stride_bt"])
def _paged_attention_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_acc_ptr, part_m_ptr, part_l_ptr, part_used_ptr,
    query_start_loc_ptr, seq_lens_ptr, block_tables_ptr, order_ptr,
    qk_scale, v_scale, window, soft_cap, num_reqs,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
    new_k_ptr, new_v_ptr, slot_mapping_ptr, cos_sin_ptr, q_norm_ptr, k_norm_ptr, norm_eps,
    k_inv_scale, v_inv_scale, stride_nkt, stride_nkh, stride_nvt, stride_nvh, stride_cos_sin,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, REQ_CHUNK: tl.constexpr,
    SPLIT: tl.constexpr, WINDOWED: tl.constexpr, SOFT_CAP: tl.constexpr, DOT_PRECISION: tl.constexpr,
    ROPE: tl.constexpr, QK_NORM: tl.constexpr, FP8_CACHE: tl.constexpr, DECODE: tl.constexpr, ORDERED: tl.constexpr,
    PREFETCH: tl.constexpr, CACHE_LINE: tl.constexpr, PDL: tl.constexpr,
):
    """DECODE: every request has one query, row i of q being request i's (a decode step): no lookup of the program's
    request in query_start_loc, two dependent loads fewer before the keys. ORDERED (decode only): program i takes
    request order[i].

    ROPE (decode steps only: one query a request): q and the new k arrive as the QKV projection left them (new_k,
    new_v: the step's k and v); each program rotates its query heads (RMS-normalized first where QK_NORM) at their
    position, the request's last, and the program whose keys hold that position writes the rotated k and v into the
    cache, then reads them back with the rest, as rotary.py's kernel would have written them.

    Before its PDL wait a program reads only what no kernel that may still run writes (query_start_loc, seq_lens,
    the block table, order, slot_mapping: the host's copies, and decode_inputs.py's, which never lets its successor
    launch early, so every kernel after it starts once it has ended), so it finds its keys, and a split without any
    ends there (split 0 always has keys, and waits), while the kernel before it runs; where PREFETCH (decode steps) it
    then asks L2 for its first key tile's keys and values and its position's cos/sin, which only this kernel writes,
    after the wait (the new key's row)."""
    pid = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_splits = tl.num_programs(2)

    if DECODE:  # request i is query row i: nothing to look up
        if ORDERED:
            req = tl.load(order_ptr + pid)
        else:
            req = pid
        q_start = req
        q_len = 1
        q_first = 0
    else:
        # Request i owns the query tiles from first_tile(i) = query_start_loc[i] // BLOCK_Q + i on (the
        # "+ i" leaves room for a partial tile per request); this program's request is the last one
        # whose first tile is <= pid.
        count = tl.zeros([], dtype=tl.int32)
        for start in range(0, num_reqs, REQ_CHUNK):
            idx = start + tl.arange(0, REQ_CHUNK)
            first_tile = tl.load(query_start_loc_ptr + idx, mask=idx < num_reqs, other=0) // BLOCK_Q
            if BLOCK_Q > 1:
                first_tile += idx
            count += tl.sum(((first_tile <= pid) & (idx < num_reqs)).to(tl.int32), 0)
        req = count - 1
        q_start = tl.load(query_start_loc_ptr + req)
        q_len = tl.load(query_start_loc_ptr + req + 1) - q_start
        tile = pid - q_start // BLOCK_Q
        if BLOCK_Q > 1:
            tile -= req
        q_first = tile * BLOCK_Q
        if q_first >= q_len:
            return
    seq_len = tl.load(seq_lens_ptr + req)
    context = seq_len - q_len

    # keys [0, full_end) are visible to every row of the tile; [full_end, kv_end) need the causal mask
    kv_end = tl.minimum(context + q_first + BLOCK_Q, seq_len)
    full_end = (context + q_first + 1) // BLOCK_N * BLOCK_N
    # with a window, the key tiles before the first query's window are skipped
    kv_start = 0
    if WINDOWED:
        kv_start = tl.maximum(context + q_first - window + 1, 0) // BLOCK_N * BLOCK_N
    tiles = tl.cdiv(kv_end - kv_start, BLOCK_N)
    tiles_per_split = tl.cdiv(tiles, num_splits)
    lo = kv_start + split * tiles_per_split * BLOCK_N
    hi = tl.minimum(lo + tiles_per_split * BLOCK_N, kv_end)
    if SPLIT and lo >= hi:
        return
    mid = tl.maximum(lo, tl.minimum(hi, full_end))

    k_ptr = k_cache_ptr + kv_head * stride_kh
    v_ptr = v_cache_ptr + kv_head * stride_vh
    table_ptr = block_tables_ptr + req.to(tl.int64) * stride_bt
    if ROPE:
        slot = tl.load(slot_mapping_ptr + q_start).to(tl.int64)
    if PREFETCH:
        _prefetch_tile(k_ptr, v_ptr, table_ptr, lo, hi, stride_kb, stride_ks, stride_vb, stride_vs,
                       BLOCK_N, HEAD_DIM, BLOCK_SIZE, CACHE_LINE)
        if ROPE:
            _prefetch_l2(cos_sin_ptr + context.to(tl.int64) * stride_cos_sin + tl.arange(0, HEAD_DIM))
    pdl_prologue(PDL)

    rows = tl.arange(0, BLOCK_M)
    dims = tl.arange(0, HEAD_DIM)
    q_tok = q_first + rows // GROUP_PAD
    head_in_group = rows % GROUP_PAD
    row_valid = (q_tok < q_len) & (head_in_group < GROUP)
    token = (q_start + q_tok).to(tl.int64)
    head = kv_head * GROUP + head_in_group
    pos = context + q_tok
    q_rows = q_ptr + token[:, None] * stride_qt + head[:, None] * stride_qh
    if ROPE:
        q = rotated_rows(q_rows, dims, row_valid[:, None], pos[:, None], cos_sin_ptr, stride_cos_sin, q_norm_ptr,
                         norm_eps, HEAD_DIM, QK_NORM)
        if (slot >= 0) & (lo <= context) & (context < hi):  # the new token (position `context`) is this split's
            new_k = rotated_rows(new_k_ptr + q_start.to(tl.int64) * stride_nkt + kv_head * stride_nkh, dims, True,
                                 context + tl.zeros([1, 1], dtype=tl.int32), cos_sin_ptr, stride_cos_sin, k_norm_ptr,
                                 norm_eps, HEAD_DIM, QK_NORM)
            tl.store(k_ptr + slot * stride_ks + dims[None, :], to_cache_values(new_k, k_ptr, k_inv_scale, FP8_CACHE))
            new_v = tl.load(new_v_ptr + q_start.to(tl.int64) * stride_nvt + kv_head * stride_nvh + dims)
            tl.store(v_ptr + slot * stride_vs + dims, to_cache_values(new_v, v_ptr, v_inv_scale, FP8_CACHE))
        tl.debug_barrier()  # the stores are seen by the program's own loads of the page
    else:
        q = tl.load(q_rows + dims[None, :], mask=row_valid[:, None], other=0.0)
    m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    for start_n in range(lo, mid, BLOCK_N):
        acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q, k_ptr, v_ptr, table_ptr, start_n, pos, kv_end, qk_scale,
                                     window, soft_cap, stride_kb, stride_ks, stride_vb, stride_vs,
                                     BLOCK_N, HEAD_DIM, BLOCK_SIZE, False, WINDOWED, SOFT_CAP, DOT_PRECISION)
    for start_n in range(mid, hi, BLOCK_N):
        acc, l_i, m_i = _attend_tile(acc, l_i, m_i, q, k_ptr, v_ptr, table_ptr, start_n, pos, kv_end, qk_scale,
                                     window, soft_cap, stride_kb, stride_ks, stride_vb, stride_vs,
                                     BLOCK_N, HEAD_DIM, BLOCK_SIZE, True, WINDOWED, SOFT_CAP, DOT_PRECISION)

    if SPLIT:
        part = (token * (tl.num_programs(1) * GROUP) + head) * num_splits + split
        tl.store(part_acc_ptr + part[:, None] * HEAD_DIM + dims[None, :], acc * v_scale, mask=row_valid[:, None])
        tl.store(part_m_ptr + part, m_i, mask=row_valid)
        tl.store(part_l_ptr + part, l_i, mask=row_valid)
        if split == 0:
            # the splits with keys: the combine reads theirs only
            used = tl.cdiv(tiles, tiles_per_split)
            tl.store(part_used_ptr + token * (tl.num_programs(1) * GROUP) + head, used + tl.zeros_like(head),
                     mask=row_valid)
    else:
        out = acc * v_scale / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(out_ptr + token[:, None] * stride_ot + head[:, None] * stride_oh + dims[None, :],
                 out.to(out_ptr.dtype.element_ty), mask=row_valid[:, None])


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def tile_config(max_query_len: int, group: int, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_Q, GROUP_PAD, BLOCK_N): query tokens per tile, padded group size, keys per K/V tile."""
    group_pad = triton.next_power_of_2(group)
    rows = min(64, max(16, triton.next_power_of_2(max_query_len) * group_pad))  # tl.dot needs >= 16 rows
    # measured on an H200: decode reads K/V fastest in 128-key tiles, prefill computes fastest in 64
    block_n = 32 if head_dim > 128 else 128 if max_query_len == 1 else 64
    return max(1, rows // group_pad), group_pad, block_n


def num_query_tiles(num_tokens: int, num_reqs: int, block_q: int) -> int:
    """The grid's first dimension but at decode steps (a program a request there): an upper bound on the query tiles
    of all requests."""
    return num_tokens if block_q == 1 else num_tokens // block_q + num_reqs


def choose_num_splits(num_programs: int, max_seq_len: int, num_sms: int) -> int:
    """Split the keys when the batch alone would leave most of the GPU idle and contexts are long."""
    if num_programs >= num_sms or max_seq_len < 2 * MIN_SPLIT_TOKENS:
        return 1
    return min(MAX_SPLITS, triton.cdiv(2 * num_sms, num_programs), max_seq_len // MIN_SPLIT_TOKENS)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    max_query_len: int,
    max_seq_len: int,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    sliding_window: int | None = None,
    logits_soft_cap: float | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    config: tuple[int, int, int] | None = None,
    rope: RopeInputs | None = None,
    new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    order: torch.Tensor | None = None,
    defer_combine: bool = False,
) -> torch.Tensor | SplitPartials:
    """Causal paged attention of a packed batch of queries over their requests' cached keys/values.

    q [T, H, D]; k_cache, v_cache [num_blocks, block_size, Hkv, D] (H a multiple of Hkv, D a power
    of two in [16, 256]); query_start_loc [num_reqs + 1], seq_lens [num_reqs], block_tables
    [num_reqs, max_blocks] int32 on q's device. Request i's queries are rows
    query_start_loc[i]:query_start_loc[i+1] of q and sit at the end of its seq_lens[i] positions.
    max_query_len and max_seq_len bound those of the batch (max_seq_len only steers the split
    choice; num_splits overrides it). Rows past query_start_loc[num_reqs] are not written. A batch with
    max_query_len 1 and as many rows as requests (a decode step) is taken to have one query a request, row i
    request i's, without reading query_start_loc.
    Returns out [T, H, D] in q's dtype. sliding_window: a query at position p sees keys at positions
    > p - sliding_window only; logits_soft_cap: scores become cap * tanh(scores / cap).

    For CUDA-graph capture, keep q.shape[0], num_reqs, max_query_len, max_seq_len (a fixed upper
    bound such as max_model_len) and scale the same at capture and replay.

    An fp8 cache holds K / k_scale and V / v_scale; the pages are converted to q's dtype as they load.
    config: (keys per K/V tile, warps, pipeline stages), for benchmarks; None takes tile_config's and 4 warps.

    rope and new_kv (k, v [T, Hkv, D], slot_mapping [T]; together, at decode steps only: max_query_len 1): q and k
    are not rotated yet, nor k and v written: the kernel rotates q and k as the rotary kernel would (each head
    RMS-normalized first where rope has norm weights), and writes the rotated k and v into contiguous caches at
    slot_mapping (slots < 0 are not written), as the rotary kernel writing the cache would have.

    order (int32 [num_reqs], a permutation of the requests, longest context first): the order in which a decode step
    of at least LARGE_DECODE rows takes its requests; other steps ignore it.

    defer_combine: where the keys were split, the splits' partial results are returned (SplitPartials) and
    combine_splits() merges them later, into out or into int8 rows for the int8 GEMV that reads them.
    """
    num_tokens, num_heads, head_dim = q.shape
    _, block_size, num_kv_heads, _ = k_cache.shape
    num_reqs = seq_lens.shape[0]
    if out is None:
        out = torch.empty_like(q)
    if num_tokens == 0 or num_reqs == 0:
        return out
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        raise ValueError(f"head_dim must be a power of two in [16, 256], got {head_dim}")
    if q.stride(-1) != 1 or out.stride(-1) != 1 or k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("paged_attention needs the head dimension contiguous")
    rope_args = _rope_args(rope, new_kv, q, k_cache, v_cache, max_query_len, k_scale, v_scale)
    group = num_heads // num_kv_heads
    block_q, group_pad, block_n = tile_config(max_query_len, group, head_dim)
    decode = max_query_len == 1 and num_tokens == num_reqs
    large_decode = decode and num_tokens >= LARGE_DECODE
    launch = {"num_warps": 4, "num_stages": 2} if large_decode else {"num_warps": 4}
    if config is not None:
        block_n, launch["num_warps"], launch["num_stages"] = config
    query_tiles = num_tokens if decode else num_query_tiles(num_tokens, num_reqs, block_q)
    if num_splits is None:
        num_splits = choose_num_splits(query_tiles * num_kv_heads, max_seq_len, _num_sms(q.device))
    split = num_splits > 1
    if split:
        part_acc = torch.empty(num_tokens, num_heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
        part_m = torch.empty(num_tokens, num_heads, num_splits, dtype=torch.float32, device=q.device)
        part_l = torch.empty_like(part_m)
        part_used = torch.empty(num_tokens, num_heads, dtype=torch.int32, device=q.device)
    else:
        part_acc = part_m = part_l = part_used = out
    ordered = large_decode and order is not None
    _paged_attention_kernel[(query_tiles, num_kv_heads, num_splits)](
        q, k_cache, v_cache, out, part_acc, part_m, part_l, part_used,
        query_start_loc, seq_lens, block_tables, order if ordered else seq_lens,
        scale * k_scale if logits_soft_cap else scale * k_scale * LOG2E, v_scale, sliding_window or 0,
        logits_soft_cap or 0.0, num_reqs,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), *rope_args,
        GROUP=group, GROUP_PAD=group_pad, BLOCK_Q=block_q, BLOCK_M=block_q * group_pad, BLOCK_N=block_n,
        HEAD_DIM=head_dim, BLOCK_SIZE=block_size, REQ_CHUNK=128,
        SPLIT=split, WINDOWED=bool(sliding_window), SOFT_CAP=bool(logits_soft_cap),
        DOT_PRECISION="ieee" if q.dtype == torch.float32 else "tf32", ROPE=rope is not None,
        QK_NORM=rope is not None and rope.norm_weights is not None, FP8_CACHE=k_cache.dtype in FP8_DTYPES,
        DECODE=decode, ORDERED=ordered, PREFETCH=decode and uses_pdl(q),
        CACHE_LINE=min(head_dim, 128 // k_cache.element_size()), **launch, **pdl_options(q),
    )
    if not split:
        return out
    partials = SplitPartials(out, part_acc, part_m, part_l, part_used, query_start_loc, num_reqs, decode)
    return partials if defer_combine else combine_splits(partials)


def _rope_args(rope: RopeInputs | None, new_kv: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None,
               q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, max_query_len: int, k_scale: float,
               v_scale: float) -> tuple[torch.Tensor | float | int, ...]:
    """The kernel's arguments new_k_ptr .. stride_cos_sin: rope's and new_kv's, or placeholders it does not read."""
    if (rope is None) != (new_kv is None):
        raise ValueError("rope and new_kv come together")
    if rope is None:
        return (q, q, q, q, q, q, 0.0, 1.0, 1.0, 0, 0, 0, 0, 0)
    k, v, slot_mapping = new_kv
    if max_query_len != 1:
        raise ValueError(f"the attention kernel rotates q and k at decode steps only, not at {max_query_len} queries")
    if k.stride(-1) != 1 or v.stride(-1) != 1 or not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("rotating in the attention kernel needs k's and v's heads and the caches contiguous")
    q_norm, k_norm = rope.norm_weights or (rope.cos_sin_cache, rope.cos_sin_cache)
    return (k, v, slot_mapping, rope.cos_sin_cache, q_norm, k_norm, rope.eps, 1.0 / k_scale,
            1.0 / v_scale, k.stride(0), k.stride(1), v.stride(0), v.stride(1), rope.cos_sin_cache.stride(0))
