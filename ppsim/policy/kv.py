"""Paged KV blocks, as vLLM's block pool: a request holds ceil(tokens / block_size) blocks.

Stages size their pools separately; the pipeline uses the minimum over stages
(vLLM ``unify_kv_cache_configs``), so one pool of that many blocks stands for every stage.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence


def unify_num_blocks(per_stage_blocks: Sequence[int]) -> int:
    """The pipeline's usable block count: the minimum over stages."""
    return min(per_stage_blocks)


class BlockPool:
    """Block ids handed out FIFO from a free list; deterministic.

    The free list is kept lazily, so a pool costs memory for the blocks in use, not for all of them (a
    block size of 1 on a large GPU is hundreds of millions of blocks): ids never handed out yet are the
    range ``[_fresh, num_blocks)``, returned ids queue in ``_returned`` behind them, which is the order a
    FIFO list of every id, returned ones appended, would hand them out in.
    """

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError("num_blocks must be >= 1")
        if block_size < 1:
            raise ValueError("block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.num_free = num_blocks  # an attribute, not a property: the driver reads it every action
        self._fresh = 0
        self._returned: deque[int] = deque()
        self._tables: dict[int, list[int]] = {}
        self.peak_used = 0

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def allocate(self, req_id: int, num_tokens: int) -> bool:
        """Grow ``req_id``'s table to hold ``num_tokens`` tokens; False (nothing taken) if short."""
        table = self._tables.get(req_id)
        if table is None:
            table = self._tables[req_id] = []
        need = -(-num_tokens // self.block_size) - len(table)  # blocks_for, inlined: called per request per step
        if need <= 0:
            return True
        if need > self.num_free:
            if not table:
                del self._tables[req_id]
            return False
        fresh = self._fresh
        take = min(need, self.num_blocks - fresh)
        if take:
            table.extend(range(fresh, fresh + take))
            self._fresh = fresh + take
        if need > take:
            pop = self._returned.popleft
            table.extend(pop() for _ in range(need - take))
        self.num_free -= need
        used = self.num_blocks - self.num_free
        if used > self.peak_used:
            self.peak_used = used
        return True

    def free(self, req_id: int) -> None:
        blocks = self._tables.pop(req_id, ())
        self._returned.extend(blocks)
        self.num_free += len(blocks)

    def block_table(self, req_id: int) -> list[int]:
        return list(self._tables.get(req_id, ()))

    def holders(self) -> int:
        return len(self._tables)
