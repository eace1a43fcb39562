"""A fixed pool of KV cache blocks: reference counts, the prefix-cache table and an LRU free list."""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    """Block ids are 0..num_blocks-1. A block is free when no request holds it (ref count 0).

    A free block keeps its cached content (its hash stays in the table) until it is handed out
    again, so a later request with the same prefix can take it back. The free list is ordered
    from least to most recently freed; `allocate` takes from the least recent end. Every
    operation is O(1).
    """

    def __init__(self, num_blocks: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self._ref_counts = [0] * num_blocks
        self._hashes: list[bytes | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, int] = {}  # block hash -> block id

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def ref_count(self, block_id: int) -> int:
        return self._ref_counts[block_id]

    def block_hash(self, block_id: int) -> bytes | None:
        return self._hashes[block_id]

    def lookup(self, block_hash: bytes) -> int | None:
        """The block holding the content with this hash, in use or free, if any."""
        return self._cached.get(block_hash)

    def allocate(self) -> int:
        """Takes the least recently freed block, dropping its cached content; ref count becomes 1."""
        block_id, _ = self._free.popitem(last=False)
        old_hash = self._hashes[block_id]
        if old_hash is not None:
            del self._cached[old_hash]
            self._hashes[block_id] = None
        self._ref_counts[block_id] = 1
        return block_id

    def acquire(self, block_id: int) -> None:
        """One more holder of a cached block; a free one is taken out of the free list."""
        if self._ref_counts[block_id] == 0:
            del self._free[block_id]
        self._ref_counts[block_id] += 1

    def release(self, block_id: int) -> None:
        """One holder fewer. A block that becomes free joins the free list: at the most recent end
        when it holds cached content, at the least recent end (reused first) when it holds none."""
        count = self._ref_counts[block_id] - 1
        if count < 0:
            raise RuntimeError(f"block {block_id} released more often than it was taken")
        self._ref_counts[block_id] = count
        if count == 0:
            self._free[block_id] = None
            if self._hashes[block_id] is None:
                self._free.move_to_end(block_id, last=False)

    def register(self, block_id: int, block_hash: bytes) -> None:
        """Records that the block holds the content with this hash. When another block already holds
        the same content (two requests computed it at once), the first one stays the cached copy."""
        if block_hash in self._cached or self._hashes[block_id] is not None:
            return
        self._cached[block_hash] = block_id
        self._hashes[block_id] = block_hash

    def reset_prefix_cache(self) -> None:
        """Forgets all cached content; blocks in use keep their data, but no request will find it."""
        self._cached.clear()
        self._hashes = [None] * self.num_blocks
