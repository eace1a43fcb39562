"""Paged KV cache bookkeeping: block tables per request and prefix caching by chained block hashes.

A full block of `block_size` tokens is identified by SHA-256(parent block's hash, its token ids),
so a hash names the block's content *and* everything before it: the same tokens at another
position, or after another prefix, give another hash. A cryptographic hash, because the cache is
shared between users: a prompt crafted to collide with another's block would read that user's KV.
Only blocks whose KV has been written are entered in the table (`cache_blocks`), so a prefix hit
never reads KV that does not exist yet.
"""

from __future__ import annotations

import hashlib
from array import array
from collections.abc import Sequence

from wick.core.block_pool import BlockPool
from wick.core.request import Request

_ROOT_HASH = bytes(32)  # the "parent hash" of a request's first block


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int = 16, enable_prefix_caching: bool = True,
                 sliding_window: int | None = None) -> None:
        """sliding_window: the window of the model's widest layer when every layer slides (else None);
        blocks that fall out of it are released while the request runs."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.sliding_window = sliding_window
        # Per request: how many of its leading blocks fell out of the window and were released.
        self._num_window_freed: dict[str, int] = {}
        self.pool = BlockPool(num_blocks)
        # Per request: how many of its leading blocks are in the prefix-cache table.
        self._num_cached_blocks: dict[str, int] = {}
        # Prefix cache statistics, in tokens, counted when a request is admitted.
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (free blocks that keep cached content count as free)."""
        return 1.0 - self.pool.num_free_blocks / self.pool.num_blocks

    @property
    def prefix_cache_hit_rate(self) -> float:
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0

    def num_blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def get_computed_blocks(self, request: Request) -> tuple[list[int], int]:
        """The longest run of cached blocks that matches the start of the request's tokens, and the
        number of tokens they hold. It never covers the last token, which must be computed so that
        the request can sample. Changes nothing but `request.block_hashes`."""
        if not self.enable_prefix_caching or _needs_prompt_logprobs(request):
            return [], 0
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._block_hashes(request, max_blocks)
        blocks = []
        for block_hash in hashes[:max_blocks]:
            block_id = self.pool.lookup(block_hash)
            if block_id is None:
                break
            blocks.append(block_id)
        return blocks, len(blocks) * self.block_size

    def allocate_slots(self, request: Request, num_new_tokens: int,
                       computed_blocks: Sequence[int] = ()) -> bool:
        """Makes the request's block table cover its computed tokens, `computed_blocks` (prefix-cache
        hits from `get_computed_blocks`, only for a request that holds no blocks yet) and
        `num_new_tokens` more. Returns False, changing nothing, when too few blocks are free.

        The caller sets `request.num_computed_tokens` (to the tokens of `computed_blocks`) on success.
        """
        if computed_blocks and (request.block_ids or request.num_computed_tokens):
            raise ValueError(f"prefix-cache hits are only taken by a request without blocks: {request}")
        num_tokens = request.num_computed_tokens + len(computed_blocks) * self.block_size + num_new_tokens
        num_needed = self.num_blocks_for(num_tokens) - len(request.block_ids) - len(computed_blocks)
        # Hits that sit in the free list leave it when taken, so they are not free for new blocks.
        num_free_hits = sum(1 for b in computed_blocks if self.pool.ref_count(b) == 0)
        if num_needed > self.pool.num_free_blocks - num_free_hits:
            return False

        if not request.block_ids and not request.num_computed_tokens and self.enable_prefix_caching:
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += len(computed_blocks) * self.block_size
            self._num_cached_blocks[request.request_id] = len(computed_blocks)
        for block_id in computed_blocks:
            self.pool.acquire(block_id)
        request.block_ids.extend(computed_blocks)
        request.block_ids.extend(self.pool.allocate() for _ in range(num_needed))
        return True

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Enters the request's full blocks among its first `num_computed_tokens` tokens (whose KV
        has been written) in the prefix-cache table."""
        if not self.enable_prefix_caching:
            return
        start = self._num_cached_blocks.get(request.request_id, 0)
        end = min(num_computed_tokens // self.block_size, len(request.block_ids))
        if end <= start:
            return
        hashes = self._block_hashes(request, end)
        for i in range(start, end):
            self.pool.register(request.block_ids[i], hashes[i])
        self._num_cached_blocks[request.request_id] = end

    def num_cached_blocks(self, request: Request) -> int:
        """How many of the request's leading blocks are in the prefix-cache table."""
        return self._num_cached_blocks.get(request.request_id, 0)

    def free_out_of_window(self, request: Request) -> None:
        """Releases the request's blocks that no future query can see: those wholly at positions
        <= num_computed_tokens - sliding_window. Their ids stay in the block table (so positions map
        to blocks as before), and attention never reads them. Call after cache_blocks()."""
        if self.sliding_window is None:
            return
        start = self._num_window_freed.get(request.request_id, 0)
        end = min((request.num_computed_tokens - self.sliding_window + 1) // self.block_size,
                  len(request.block_ids))
        if end <= start:
            return
        for block_id in request.block_ids[start:end]:
            self.pool.release(block_id)
        self._num_window_freed[request.request_id] = end

    def free(self, request: Request) -> None:
        """Releases the request's blocks, last block first so that a sequence's tail is evicted
        before its head. `request.block_hashes` stays: it describes tokens, not blocks."""
        already = self._num_window_freed.pop(request.request_id, 0)
        for block_id in reversed(request.block_ids[already:]):
            self.pool.release(block_id)
        request.block_ids = []
        self._num_cached_blocks.pop(request.request_id, None)

    def reset_prefix_cache(self) -> None:
        """Forgets all cached content. Blocks of running requests are not entered again."""
        self.pool.reset_prefix_cache()
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    def _block_hashes(self, request: Request, num_blocks: int) -> list[bytes]:
        """`request.block_hashes`, extended to cover at least its first `num_blocks` full blocks."""
        hashes = request.block_hashes
        size = self.block_size
        tokens = request.all_token_ids
        for i in range(len(hashes), num_blocks):
            parent = hashes[i - 1] if i else _ROOT_HASH
            block = array("q", tokens[i * size:(i + 1) * size]).tobytes()
            hashes.append(hashlib.sha256(parent + block).digest())
        return hashes


def _needs_prompt_logprobs(request: Request) -> bool:
    """Prompt logprobs come from computing the prompt, so a request still collecting them gets no hits."""
    wanted = request.sampling_params.prompt_logprobs is not None
    return wanted and len(request.prompt_logprobs) < request.num_prompt_tokens - 1
