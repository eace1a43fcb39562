"""The paged attention kernel against its pure-torch reference: prefill, chunked prefill over cached
context, decode and mixed batches, GQA, split-KV, padding rows."""

from __future__ import annotations

from typing import NamedTuple

import pytest
import torch

from wick.kernels import paged_attention as paged_attention_module
from wick.kernels.kv_cache_write import KVCacheTarget
from wick.kernels.paged_attention import choose_num_splits, paged_attention
from wick.kernels.paged_attention_ref import paged_attention_ref
from wick.kernels.rotary import rotary_embedding
from wick.layers.rotary import RopeInputs, get_rope

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
MIXED = ([1, 9, 17, 30, 70], [1, 9, 5, 1, 3])  # (seq_lens, query_lens): prefills, chunks over context, decodes
DECODE = ([1, 16, 17, 40], [1, 1, 1, 1])
TOLERANCE = {torch.float32: 2e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}


class Batch(NamedTuple):
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor


def make_batch(seq_lens: list[int], query_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int,
               block_size: int, dtype: torch.dtype, pad_tokens: int = 0, device: str = DEVICE) -> Batch:
    """Pages in random order; page 0 (what block tables are padded with) and every slot past a
    request's context hold NaN, which the kernel must never let into a result."""
    torch.manual_seed(0)
    num_pages = [-(-n // block_size) for n in seq_lens]
    order = (torch.randperm(sum(num_pages)) + 1).tolist()
    tables = [[order.pop() for _ in range(n)] for n in num_pages]
    width = max(num_pages)
    block_tables = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    caches = torch.full((2, sum(num_pages) + 1, block_size, num_kv_heads, head_dim), float("nan"), dtype=dtype)
    for table, seq_len in zip(tables, seq_lens, strict=True):
        flat = caches[:, table].flatten(1, 2)
        flat[:, :seq_len] = torch.randn(2, seq_len, num_kv_heads, head_dim, dtype=dtype)
        caches[:, table] = flat.unflatten(1, (len(table), block_size))
    starts = torch.tensor([0, *query_lens]).cumsum(0).to(torch.int32)
    q = torch.randn(sum(query_lens) + pad_tokens, num_heads, head_dim, dtype=dtype)
    tensors = (q, caches[0], caches[1], starts, torch.tensor(seq_lens, dtype=torch.int32), block_tables)
    return Batch(*(t.to(device) for t in tensors))


def check(seq_lens: list[int], query_lens: list[int], num_heads: int = 4, num_kv_heads: int = 2, head_dim: int = 16,
          block_size: int = 4, dtype: torch.dtype = torch.float32, num_splits: int | None = None,
          device: str = DEVICE, sliding_window: int | None = None, soft_cap: float | None = None,
          config: tuple[int, int, int] | None = None, order: list[int] | None = None) -> None:
    batch = make_batch(seq_lens, query_lens, num_heads, num_kv_heads, head_dim, block_size, dtype, device=device)
    scale = head_dim**-0.5
    out = paged_attention(*batch, scale, max(query_lens), max(seq_lens), num_splits=num_splits,
                          sliding_window=sliding_window, logits_soft_cap=soft_cap, config=config,
                          order=None if order is None else torch.tensor(order, dtype=torch.int32, device=device))
    expected = paged_attention_ref(*batch, scale, sliding_window, soft_cap)
    assert out.dtype == dtype
    torch.testing.assert_close(out, expected, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("group", [1, 2, 4])
def test_mixed_batch(dtype: torch.dtype, group: int) -> None:
    check(*MIXED, num_heads=2 * group, dtype=dtype)


@pytest.mark.parametrize("group", [1, 4])
def test_decode(group: int) -> None:
    check(*DECODE, num_heads=2 * group, head_dim=32, block_size=16, dtype=torch.float16)


@pytest.mark.parametrize("config", [(32, 2, 1), (64, 8, 2)])
def test_decode_other_configs(config: tuple[int, int, int]) -> None:
    """The benchmark's configs (keys a tile, warps, stages) compute the same attention."""
    check(*DECODE, num_heads=4, head_dim=32, block_size=16, dtype=torch.float16, num_splits=2, config=config)


def test_prefill_longer_than_a_tile() -> None:
    check([150, 70], [150, 70], num_heads=2, num_kv_heads=1, block_size=16)


def test_group_not_a_power_of_two() -> None:
    check(*MIXED, num_heads=6, num_kv_heads=2)


@pytest.mark.parametrize("num_splits", [2, 3])
@pytest.mark.parametrize("shape", [MIXED, DECODE], ids=["mixed", "decode"])
def test_split_kv(shape: tuple[list[int], list[int]], num_splits: int) -> None:
    check(*shape, num_heads=8, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 2])
def test_large_decode_takes_its_requests_in_order(monkeypatch: pytest.MonkeyPatch, num_splits: int) -> None:
    monkeypatch.setattr(paged_attention_module, "LARGE_DECODE", 4)
    check(*DECODE, num_heads=4, head_dim=32, block_size=16, dtype=torch.float16, num_splits=num_splits,
          order=[3, 1, 2, 0])


@pytest.mark.parametrize(("rows", "written"), [(4, [2]), (3, [0, 1, 2])])
def test_order_names_the_requests_a_large_decode_attends(monkeypatch: pytest.MonkeyPatch, rows: int,
                                                          written: list[int]) -> None:
    """Every program given request 2: only its row is written. Below LARGE_DECODE rows the order is not read."""
    monkeypatch.setattr(paged_attention_module, "LARGE_DECODE", 4)
    batch = make_batch(DECODE[0][:rows], [1] * rows, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4,
                       dtype=torch.float32)
    out = torch.full_like(batch.q, 7.0)
    paged_attention(*batch, 0.25, 1, max(DECODE[0]), out=out,
                    order=torch.full((rows,), 2, dtype=torch.int32, device=DEVICE))
    expected = paged_attention_ref(*batch, 0.25)
    assert [i for i in range(rows) if not (out[i] == 7.0).all()] == written
    torch.testing.assert_close(out[written], expected[written], atol=2e-5, rtol=2e-5)


def test_splits_without_keys_never_reach_the_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """Splits past a context's keys write nothing: what their partials' memory holds (NaN here) must not reach the
    result."""
    empty, empty_like = torch.empty, torch.empty_like

    def poisoned(make):
        def allocate(*args, **kwargs):
            t = make(*args, **kwargs)
            return t.fill_(float("nan")) if t.is_floating_point() else t
        return allocate

    monkeypatch.setattr(torch, "empty", poisoned(empty))
    monkeypatch.setattr(torch, "empty_like", poisoned(empty_like))
    check(*DECODE, num_heads=8, num_splits=4)  # one key tile a request: splits 1-3 have none


@pytest.mark.parametrize("num_splits", [1, 2])
def test_rows_outside_requests_untouched(num_splits: int) -> None:
    batch = make_batch(*DECODE, num_heads=4, num_kv_heads=2, head_dim=16, block_size=4, dtype=torch.float32,
                       pad_tokens=3)
    out = torch.full_like(batch.q, 7.0)
    paged_attention(*batch, 0.25, 1, max(DECODE[0]), out=out, num_splits=num_splits)
    assert (out[-3:] == 7.0).all()
    torch.testing.assert_close(out[:-3], paged_attention_ref(*batch, 0.25)[:-3], atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("num_splits", [1, 2])
@pytest.mark.parametrize("window", [1, 5, 16])
def test_sliding_window_past_the_window(window: int, num_splits: int) -> None:
    # prefills longer than the window and than a key tile, chunks and decodes far past it
    check([150, 70, 40, 17], [150, 9, 1, 1], num_heads=4, num_kv_heads=2, block_size=4, num_splits=num_splits,
          sliding_window=window)


def test_window_never_reads_keys_before_it() -> None:
    """Pages wholly before every query's window may be freed: NaN there must not reach the result."""
    seq_lens, query_lens, window = [100, 64], [1, 3], 8
    batch = make_batch(seq_lens, query_lens, 4, 2, 16, 4, torch.float32)
    expected = paged_attention_ref(*batch, 0.25, window)
    for i, seq_len in enumerate(seq_lens):
        first_visible = seq_len - query_lens[i] - window + 1
        for page in batch.block_tables[i, : first_visible // 4].tolist():
            batch.k_cache[page] = float("nan")
            batch.v_cache[page] = float("nan")
    out = paged_attention(*batch, 0.25, max(query_lens), max(seq_lens), sliding_window=window)
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("soft_cap", [2.0, 50.0])
def test_logits_soft_cap(soft_cap: float) -> None:
    check(*MIXED, num_heads=4, soft_cap=soft_cap)
    check([150, 40], [150, 1], num_heads=4, soft_cap=soft_cap, sliding_window=16)


def test_split_choice() -> None:
    sms = 132
    assert choose_num_splits(num_programs=8, max_seq_len=8192, num_sms=sms) > 1  # one request, 8 KV heads
    assert choose_num_splits(num_programs=8, max_seq_len=100, num_sms=sms) == 1  # short context
    assert choose_num_splits(num_programs=8, max_seq_len=640, num_sms=sms) == 10  # 64 keys a split
    assert choose_num_splits(num_programs=512, max_seq_len=8192, num_sms=sms) == 1  # the batch fills the GPU
    assert choose_num_splits(num_programs=1, max_seq_len=1 << 20, num_sms=sms) == 64


def test_a_decode_step_counts_a_program_per_request_and_kv_head(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not per query tile: 8 requests of one query are 8 programs a KV head (tiles of 8 rows would count 9)."""
    counted = []
    choose = paged_attention_module.choose_num_splits
    monkeypatch.setattr(paged_attention_module, "choose_num_splits",
                        lambda programs, *args: counted.append(programs) or choose(programs, *args))
    check([5, 9, 1, 16, 17, 40, 3, 8], [1] * 8, num_heads=4, head_dim=16)
    assert counted == [16]


def exact_rotation(x: torch.Tensor, positions: torch.Tensor, cos_sin: torch.Tensor, weight: torch.Tensor | None,
                   eps: float = 1e-6) -> torch.Tensor:
    """x [T, heads, D] RMS-normalized by weight (if given) and rotated by halves at positions, in float64."""
    x = x.double()
    if weight is not None:
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.double()
    half = x.shape[-1] // 2
    cos, sin = cos_sin[positions].double()[:, None].split(half, dim=-1)
    x1, x2 = x.split(half, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def check_rotating(seq_lens: list[int], num_heads: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                   cache_dtype: torch.dtype | None = None, norms: bool = False, num_splits: int | None = None,
                   sliding_window: int | None = None, device: str = DEVICE, order: list[int] | None = None) -> None:
    """A decode step whose q and k come unrotated (views of one QKV row, as the projection leaves them): the kernel
    rotating them and writing the new K/V itself against the rotary kernel writing the cache, then the kernel. A
    request of one token has slot -1, as a CUDA graph's padding rows (nothing is written for it); the last token
    belongs to no request, unless the requests come in an order (a decode graph's step: a token a request). Same
    caches, same attention."""
    pad = 0 if order else 1
    batch = make_batch(seq_lens, [1] * len(seq_lens), num_heads, num_kv_heads, head_dim, 16, dtype, pad_tokens=pad,
                       device=device)
    k_cache, v_cache = batch.k_cache, batch.v_cache
    if cache_dtype is not None:
        k_cache, v_cache = (torch.nan_to_num(c).to(cache_dtype) for c in (k_cache, v_cache))
    num_tokens = len(seq_lens) + pad
    qkv = torch.randn(num_tokens, (num_heads + 2 * num_kv_heads) * head_dim, dtype=dtype, device=device) * 2
    q, k, v = qkv.split([num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1)
    positions = torch.tensor([*seq_lens, 1][:num_tokens], device=device) - 1
    tables = batch.block_tables.long()
    positions = positions[:len(seq_lens)]
    slots = tables[torch.arange(len(seq_lens), device=device), positions // 16] * 16 + positions % 16
    slots = torch.cat([slots.masked_fill(batch.seq_lens == 1, -1), slots.new_full((pad,), -1)])
    positions = torch.cat([positions, positions.new_zeros(pad)])
    cos_sin = get_rope(head_dim, max(seq_lens), 10000.0).to(device).cos_sin_cache
    weights = tuple(torch.rand(head_dim, dtype=dtype, device=device) + 0.5 for _ in range(2)) if norms else None
    scale = head_dim**-0.5
    k_scale, v_scale = (0.5, 0.25) if cache_dtype is not None else (1.0, 1.0)
    args = (batch.query_start_loc, batch.seq_lens, batch.block_tables, scale, 1, max(seq_lens))
    options = dict(num_splits=num_splits, sliding_window=sliding_window, k_scale=k_scale, v_scale=v_scale,
                   order=None if order is None else torch.tensor(order, dtype=torch.int32, device=device))
    caches = (k_cache.clone(), v_cache.clone())
    rotated_q, _ = rotary_embedding(positions, q, k, cos_sin, weights, 1e-6, v,
                                    KVCacheTarget(*caches, slots, k_scale, v_scale))
    expected = paged_attention(rotated_q.view(num_tokens, num_heads, head_dim), *caches, *args, **options)
    out = paged_attention(q.view(num_tokens, num_heads, head_dim), k_cache, v_cache, *args, **options,
                          rope=RopeInputs(cos_sin, weights, 1e-6),
                          new_kv=(k.view(num_tokens, num_kv_heads, head_dim), v.view(num_tokens, num_kv_heads,
                                                                                       head_dim), slots))
    written = slots[slots >= 0]
    new_v, expected_v = (cache.flatten(0, 1)[written] for cache in (v_cache, caches[1]))
    assert torch.equal(new_v.view(torch.uint8), expected_v.view(torch.uint8))  # v as it came
    # the rotated k: within two steps of the formats at the head's magnitude of the rotary kernel's, and on average as
    # close to the exact rotation as it (on an H100 a quarter of bf16 elements differ from it by a step)
    new_k, expected_k = (cache.flatten(0, 1)[written].double() for cache in (k_cache, caches[0]))
    step = max(torch.finfo(dtype).eps, torch.finfo(k_cache.dtype).eps)
    torch.testing.assert_close(new_k, expected_k, atol=2 * step * expected_k.abs().max().item(), rtol=0)
    exact = exact_rotation(k.view(num_tokens, num_kv_heads, head_dim), positions, cos_sin,
                           weights[1] if norms else None)[slots >= 0] / k_scale
    assert (new_k - exact).abs().mean() <= 1.25 * (expected_k - exact).abs().mean() + 1e-12
    for ours, theirs in zip((k_cache, v_cache), caches, strict=True):  # nothing else written
        ours[written // 16, written % 16] = theirs[written // 16, written % 16]
        assert torch.equal(ours.view(torch.uint8), theirs.view(torch.uint8))
    torch.testing.assert_close(out[:len(seq_lens)], expected[:len(seq_lens)], atol=TOLERANCE[dtype],
                               rtol=TOLERANCE[dtype])


@pytest.mark.parametrize("num_splits", [1, 3])
@pytest.mark.parametrize(("dtype", "norms"), [(torch.float32, False), (torch.float16, True)])
def test_decode_rotating_q_and_k(dtype: torch.dtype, norms: bool, num_splits: int) -> None:
    check_rotating([1, 16, 17, 40, 33], 4, 2, 32, dtype, norms=norms, num_splits=num_splits)


def test_large_decode_rotating_in_order(monkeypatch: pytest.MonkeyPatch) -> None:
    """A decode graph's step: a token a request, taken longest context first; each program writes its request's k."""
    monkeypatch.setattr(paged_attention_module, "LARGE_DECODE", 4)
    check_rotating([1, 16, 17, 40, 33], 4, 2, 32, torch.float16, norms=True, num_splits=2, order=[3, 4, 2, 1, 0])


def test_decode_rotating_into_fp8_pages_past_a_window() -> None:
    # 300 keys: the window starts past the first key tiles, and the split holding the new token starts past key 0
    check_rotating([5, 40, 300], 6, 2, 16, torch.float16, cache_dtype=torch.float8_e4m3fn, norms=True, num_splits=2,
                   sliding_window=8)


def test_rotating_needs_a_decode_step_and_the_new_keys() -> None:
    batch = make_batch(*MIXED, 4, 2, 16, 4, torch.float32)
    k = torch.zeros(batch.q.shape[0], 2, 16)
    rope = RopeInputs(get_rope(16, 128, 10000.0).cos_sin_cache, None, 1e-6)
    with pytest.raises(ValueError, match="decode steps only"):
        paged_attention(*batch, 0.25, max(MIXED[1]), max(MIXED[0]), rope=rope, new_kv=(k, k, k[:, 0, 0].long()))
    with pytest.raises(ValueError, match="come together"):
        paged_attention(*batch, 0.25, 1, max(MIXED[0]), rope=rope)


def test_defer_combine_without_splits_is_the_output() -> None:
    batch = make_batch(*DECODE, 4, 2, 32, 4, torch.float32)
    out = paged_attention(*batch, 32**-0.5, 1, max(DECODE[0]), num_splits=1, defer_combine=True)
    assert torch.equal(out, paged_attention(*batch, 32**-0.5, 1, max(DECODE[0]), num_splits=1))


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("num_splits", [None, 1, 4])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
@pytest.mark.parametrize("batch_size", [1, 64])
def test_decode_bf16_cuda(batch_size: int, head_dim: int, num_splits: int | None) -> None:
    seq_lens = torch.randint(1, 1025, (batch_size,), generator=torch.Generator().manual_seed(1)).tolist()
    seq_lens[0] = 1024
    check(seq_lens, [1] * batch_size, num_heads=16, num_kv_heads=8, head_dim=head_dim, block_size=16,
          dtype=torch.bfloat16, num_splits=num_splits, device="cuda")


@pytest.mark.gpu
@requires_cuda
def test_long_decode_splits_bf16_cuda() -> None:
    check([8192], [1], num_heads=32, num_kv_heads=8, head_dim=128, block_size=16, dtype=torch.bfloat16,
          device="cuda")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("num_heads", [16, 32])
def test_prefill_bf16_cuda(num_heads: int) -> None:
    check([1000, 1000], [1000, 1000], num_heads=num_heads, num_kv_heads=8, head_dim=128, block_size=16,
          dtype=torch.bfloat16, device="cuda")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_chunked_prefill_and_decode_bf16_cuda(head_dim: int) -> None:
    check([1000, 3000, 700, 5000, 17], [1000, 500, 1, 1, 17], num_heads=14, num_kv_heads=2, head_dim=head_dim,
          block_size=16, dtype=torch.bfloat16, device="cuda")


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("num_splits", [None, 1, 4])
def test_sliding_window_and_soft_cap_bf16_cuda(num_splits: int | None) -> None:
    check([3000, 5000, 700, 17], [1000, 1, 1, 17], num_heads=16, num_kv_heads=8, head_dim=128, block_size=16,
          dtype=torch.bfloat16, device="cuda", num_splits=num_splits, sliding_window=1024)
    check([4096, 600], [1, 600], num_heads=8, num_kv_heads=4, head_dim=256, block_size=16,
          dtype=torch.bfloat16, device="cuda", num_splits=num_splits, sliding_window=512, soft_cap=50.0)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("cache_dtype", [None, torch.float8_e4m3fn])
@pytest.mark.parametrize("batch_size", [1, 64])
def test_decode_rotating_bf16_cuda(batch_size: int, cache_dtype: torch.dtype | None) -> None:
    seq_lens = torch.randint(1, 1025, (batch_size,), generator=torch.Generator().manual_seed(1)).tolist()
    seq_lens[0] = 1024
    check_rotating(seq_lens, 16, 8, 128, torch.bfloat16, cache_dtype=cache_dtype, norms=True, device="cuda")
