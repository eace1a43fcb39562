"""KVCacheManager: block tables, reference counts, prefix caching by chained hashes, LRU eviction."""

from __future__ import annotations

import hashlib
import struct

import pytest

from wick.core.kv_cache_manager import KVCacheManager
from wick.core.request import Request
from wick.sampling_params import SamplingParams


def make_request(request_id: str, tokens: list[int], **params: object) -> Request:
    return Request(request_id, tokens, SamplingParams(**params), seed=0)


def admit(kv: KVCacheManager, request: Request) -> int:
    """Prefix-cache lookup and allocation for the whole prompt, as the scheduler does; returns the hit tokens."""
    blocks, num_cached = kv.get_computed_blocks(request)
    assert kv.allocate_slots(request, request.num_tokens - num_cached, blocks)
    request.num_computed_tokens = num_cached
    return num_cached


def compute(kv: KVCacheManager, request: Request) -> None:
    """Pretends the model wrote the KV of every token the request has blocks for."""
    request.num_computed_tokens = request.num_tokens
    kv.cache_blocks(request, request.num_computed_tokens)


def test_allocation_grows_the_block_table_one_block_at_a_time() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4)
    request = make_request("a", list(range(10)))
    assert kv.allocate_slots(request, 10)
    assert len(request.block_ids) == 3 and len(set(request.block_ids)) == 3
    assert kv.num_free_blocks == 7
    assert kv.usage == pytest.approx(0.3)

    compute(kv, request)
    request.append_output_token(99)  # 11 tokens: still 3 blocks
    assert kv.allocate_slots(request, 1)
    assert len(request.block_ids) == 3
    compute(kv, request)
    request.append_output_token(98)
    request.append_output_token(97)  # 13 tokens: a fourth block
    assert kv.allocate_slots(request, 2)
    assert len(request.block_ids) == 4 and kv.num_free_blocks == 6

    kv.free(request)
    assert request.block_ids == [] and kv.num_free_blocks == 10 and kv.usage == 0.0


def test_not_enough_blocks_returns_false_and_changes_nothing() -> None:
    kv = KVCacheManager(num_blocks=4, block_size=4)
    first = make_request("a", list(range(8)))
    admit(kv, first)
    compute(kv, first)
    second = make_request("b", list(range(8)) + [50] * 9)  # hits 2 blocks, needs 3 more
    blocks, num_cached = kv.get_computed_blocks(second)
    assert num_cached == 8
    assert not kv.allocate_slots(second, second.num_tokens - num_cached, blocks)
    assert second.block_ids == [] and kv.num_free_blocks == 2
    assert [kv.pool.ref_count(b) for b in first.block_ids] == [1, 1]
    assert kv.prefix_cache_queries == 8  # only the admitted request was counted

    # The hits are free blocks: taking them leaves too few for the new ones.
    kv.free(first)
    assert kv.num_free_blocks == 4
    third = make_request("c", list(range(8)) + [50] * 9)
    blocks, num_cached = kv.get_computed_blocks(third)
    assert num_cached == 8
    assert not kv.allocate_slots(third, third.num_tokens - num_cached, blocks)
    assert kv.num_free_blocks == 4 and third.block_ids == []


def test_requests_with_a_common_prefix_share_blocks() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4)
    first = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert admit(kv, first) == 0
    compute(kv, first)
    second = make_request("b", [1, 2, 3, 4, 5, 6, 7, 8, 20, 21])
    assert admit(kv, second) == 8
    assert second.block_ids[:2] == first.block_ids[:2]
    assert second.block_ids[2] != first.block_ids[2]
    assert [kv.pool.ref_count(b) for b in second.block_ids] == [2, 2, 1]
    assert second.block_hashes[:2] == first.block_hashes[:2]
    assert kv.num_free_blocks == 10 - 4
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (19, 8)
    assert kv.prefix_cache_hit_rate == pytest.approx(8 / 19)

    kv.free(first)
    assert kv.num_free_blocks == 10 - 3  # the shared blocks are still held by the second request
    kv.free(second)
    assert kv.num_free_blocks == 10


def test_a_different_prefix_does_not_match() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4)
    first = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    admit(kv, first)
    compute(kv, first)
    assert kv.get_computed_blocks(make_request("b", [1, 2, 3, 5, 5, 6, 7, 8, 9])) == ([], 0)
    # The same block content after another first block has another hash: the chain includes the parent.
    other = make_request("c", [9, 9, 9, 9, 5, 6, 7, 8, 9])
    assert kv.get_computed_blocks(other) == ([], 0)
    assert other.block_hashes[1] != first.block_hashes[1]
    # And the same content at another position does not match either.
    shifted = make_request("d", [5, 6, 7, 8, 1, 2, 3, 4, 9])
    assert kv.get_computed_blocks(shifted) == ([], 0)


def test_block_hashes_are_chained_sha256() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4)
    tokens = [7, 2**40, 3, 151_643, 0, 1, 2, 3, 5]
    request = make_request("a", tokens)
    kv.get_computed_blocks(request)
    first = hashlib.sha256(bytes(32) + struct.pack("<4q", *tokens[:4])).digest()
    second = hashlib.sha256(first + struct.pack("<4q", *tokens[4:8])).digest()
    assert request.block_hashes == [first, second]


def test_hits_never_cover_the_last_token() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4)
    first = make_request("a", list(range(8)))
    admit(kv, first)
    compute(kv, first)
    assert len(first.block_hashes) == 2
    blocks, num_cached = kv.get_computed_blocks(make_request("b", list(range(8))))
    assert (blocks, num_cached) == (first.block_ids[:1], 4)
    blocks, num_cached = kv.get_computed_blocks(make_request("c", list(range(9))))
    assert (blocks, num_cached) == (first.block_ids, 8)


def test_only_blocks_with_written_kv_are_cached() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4)
    first = make_request("a", list(range(12)))
    admit(kv, first)
    probe = make_request("b", list(range(12)) + [0])
    assert kv.get_computed_blocks(probe) == ([], 0)  # allocated, but nothing computed yet
    kv.cache_blocks(first, 7)  # one chunk of 7 tokens: one full block written
    assert kv.get_computed_blocks(probe) == (first.block_ids[:1], 4)
    kv.cache_blocks(first, 12)
    assert kv.get_computed_blocks(probe) == (first.block_ids, 12)


def test_free_blocks_are_evicted_least_recently_used_first_tail_first() -> None:
    kv = KVCacheManager(num_blocks=6, block_size=2)
    a = make_request("a", [1, 1, 2, 2, 3])  # two full blocks and a partial one
    b = make_request("b", [7, 7, 8])
    for request in (a, b):
        admit(kv, request)
        compute(kv, request)
    a_blocks, b_blocks = list(a.block_ids), list(b.block_ids)
    kv.free(a)
    kv.free(b)
    assert kv.num_free_blocks == 6
    # Blocks without cached content (the partial tails) and the never-used block go first.
    filler = make_request("f", [0] * 6)
    assert kv.allocate_slots(filler, 6)
    assert set(filler.block_ids) == {a_blocks[2], b_blocks[1], 5}
    # Then a's tail block (freed before its head), then a's head, then b (freed last).
    fresh = make_request("g", [4, 4])
    assert kv.allocate_slots(fresh, 2)
    assert fresh.block_ids == [a_blocks[1]]
    assert kv.get_computed_blocks(make_request("x", [1, 1, 2, 2, 3])) == ([a_blocks[0]], 2)
    assert kv.get_computed_blocks(make_request("y", [7, 7, 8])) == ([b_blocks[0]], 2)


def test_a_hit_on_a_free_block_takes_it_out_of_the_free_list() -> None:
    kv = KVCacheManager(num_blocks=3, block_size=2)
    a = make_request("a", [1, 2, 3])
    admit(kv, a)
    compute(kv, a)
    cached = a.block_ids[0]
    kv.free(a)
    b = make_request("b", [1, 2, 5, 6, 7])
    assert admit(kv, b) == 2
    assert b.block_ids[0] == cached and kv.pool.ref_count(cached) == 1
    assert kv.num_free_blocks == 0
    kv.free(b)
    # Reusing a block with cached content drops its hash from the table.
    c = make_request("c", [9] * 6)
    assert kv.allocate_slots(c, 6)
    assert kv.get_computed_blocks(make_request("d", [1, 2, 3])) == ([], 0)
    assert kv.pool.block_hash(cached) is None


def test_prefix_caching_disabled() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4, enable_prefix_caching=False)
    a = make_request("a", list(range(9)))
    admit(kv, a)
    compute(kv, a)
    assert a.block_hashes == []
    b = make_request("b", list(range(9)))
    assert admit(kv, b) == 0
    assert set(a.block_ids).isdisjoint(b.block_ids)
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (0, 0)


def test_reset_prefix_cache() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = make_request("a", list(range(9)))
    admit(kv, a)
    compute(kv, a)
    kv.reset_prefix_cache()
    assert kv.get_computed_blocks(make_request("b", list(range(9)))) == ([], 0)
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (0, 0)
    kv.free(a)
    assert kv.num_free_blocks == 10


def test_no_hits_while_prompt_logprobs_are_still_wanted() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4)
    a = make_request("a", list(range(9)))
    admit(kv, a)
    compute(kv, a)
    b = make_request("b", list(range(9)), prompt_logprobs=1)
    assert kv.get_computed_blocks(b) == ([], 0)
    b.prompt_logprobs = [None] * 8  # all collected (after a preemption, say): hits are fine again
    assert kv.get_computed_blocks(b)[1] == 8


def test_ref_counts_and_free_list_stay_consistent_over_many_requests() -> None:
    kv = KVCacheManager(num_blocks=16, block_size=4)
    live: list[Request] = []
    for i in range(60):
        tokens = [i % 3] * 8 + [i % 5] * (i % 7 + 1)
        request = make_request(str(i), tokens)
        blocks, num_cached = kv.get_computed_blocks(request)
        while not kv.allocate_slots(request, request.num_tokens - num_cached, blocks):
            kv.free(live.pop(0))
            blocks, num_cached = kv.get_computed_blocks(request)
        request.num_computed_tokens = num_cached
        compute(kv, request)
        live.append(request)
        held = sum(kv.pool.ref_count(b) > 0 for b in range(16))
        assert held + kv.num_free_blocks == 16
    for request in live:
        kv.free(request)
    assert kv.num_free_blocks == 16
    assert all(kv.pool.ref_count(b) == 0 for b in range(16))


def test_blocks_out_of_every_window_are_released_once() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4, sliding_window=6)
    request = make_request("a", list(range(13)))
    admit(kv, request)
    compute(kv, request)  # 13 computed: the next query (position 13) sees keys 8..13
    kv.free_out_of_window(request)
    assert kv.num_free_blocks == 10 - 4 + 2  # blocks of positions 0-3 and 4-7 released
    assert len(request.block_ids) == 4  # their ids stay: positions still map to blocks
    kv.free_out_of_window(request)
    assert kv.num_free_blocks == 8  # nothing released twice
    request.append_output_token(5)
    assert kv.allocate_slots(request, 1)
    compute(kv, request)  # 14 computed: keys 9.. are visible, block 2 (8-11) still is
    kv.free_out_of_window(request)
    assert kv.num_free_blocks == 8
    kv.free(request)
    assert kv.num_free_blocks == 10 and request.block_ids == []


def test_released_window_blocks_stay_prefix_cached() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4, sliding_window=4)
    tokens = list(range(13))
    first = make_request("a", tokens)
    admit(kv, first)
    compute(kv, first)
    kv.free_out_of_window(first)
    second = make_request("b", tokens)
    assert admit(kv, second) == 12  # the released blocks still hold their KV until they are reused
    kv.free(first)
    kv.free(second)
    assert kv.num_free_blocks == 10


def test_no_window_releases_nothing() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4)
    request = make_request("a", list(range(13)))
    admit(kv, request)
    compute(kv, request)
    kv.free_out_of_window(request)
    assert kv.num_free_blocks == 6


def test_a_request_shorter_than_the_window_keeps_its_blocks() -> None:
    kv = KVCacheManager(num_blocks=10, block_size=4, sliding_window=8)
    request = make_request("a", list(range(6)))
    admit(kv, request)
    compute(kv, request)
    kv.free_out_of_window(request)
    assert kv.num_free_blocks == 8
