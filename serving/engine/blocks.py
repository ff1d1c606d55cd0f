"""KV block accounting: which of the pool's fixed-size blocks each request holds. Pure Python, no torch.

The pool (`draftwheel.serving.engine.batch_kv.KVPool`) has `n_blocks` blocks of `block_size` token
positions; a request's block table lists its blocks in position order. A request is given every block
it can ever need when it is admitted (prompt + max_new_tokens positions), so a running request never
waits for memory and nothing is ever preempted; its blocks come back when it finishes or is cancelled.
Blocks are handed out as one run of consecutive blocks where the pool has one (first fit), else the
lowest free ones: a request on consecutive blocks has its keys read in place, without a gather.
Not here: the tensors (batch_kv), who is admitted when (draftwheel.serving.engine.scheduler).
"""

from __future__ import annotations

import bisect


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free blocks than asked for."""


class BlockManager:
    def __init__(self, n_blocks: int, block_size: int):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"kv_blocks and kv_block_size must be >= 1, got {n_blocks} and {block_size}")
        self.n_blocks, self.block_size = n_blocks, block_size
        self._free: list[int] = list(range(n_blocks))  # sorted

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def blocks_for(self, n_positions: int) -> int:
        return -(-n_positions // self.block_size)

    def can_allocate(self, n_positions: int) -> bool:
        return self.blocks_for(n_positions) <= len(self._free)

    def allocate(self, n_positions: int) -> list[int]:
        """A block table for `n_positions` positions; raises OutOfBlocksError when the pool is short."""
        n = self.blocks_for(n_positions)
        if n > len(self._free):
            raise OutOfBlocksError(f"{n} KV blocks needed, {len(self._free)} free")
        free = self._free
        start = next((i for i in range(len(free) - n + 1) if free[i + n - 1] - free[i] == n - 1), 0)
        table = free[start:start + n]
        del free[start:start + n]
        return table

    def release(self, table: list[int]) -> None:
        """Give a request's blocks back (its table is emptied, so a second release is a no-op)."""
        for block in table:
            bisect.insort(self._free, block)
        table.clear()
