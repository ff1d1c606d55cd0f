"""KV block accounting: which of the pool's fixed-size blocks each request holds. Pure Python, no torch.

The pool (`draftwheel.serving.engine.batch_kv.KVPool`) has `n_blocks` blocks of `block_size` token
positions; a request's block table lists its blocks in position order. A request is given every block
it can ever need when it is admitted (prompt + max_new_tokens positions), so a running request never
waits for memory and nothing is ever preempted; its blocks come back when it finishes or is cancelled.
Blocks are handed out as one run of consecutive blocks where the pool has one (first fit), else the
lowest free ones: a request on consecutive blocks has its keys read in place, without a gather.

Prefix sharing (`prefix_caching`): once a request has read its prompt, each full block of it is
registered under (the block registered for the prompt up to its start, its own tokens): a chain, as
vLLM's and nano-vllm's block hashes, but keyed exactly (a dict compares the tokens), so no collision can
ever share wrongly; forgetting a block forgets the blocks registered after it. A later request whose prompt starts with
the same full blocks is given those blocks, shared (counted by reference), and does not compute them
again; only blocks past the shared ones are its own, and it computes at least its prompt's last token
(whose logits it reads). Shared blocks hold prompt positions only and a request writes only past them,
so no block is ever written while shared: copy-on-write never has to copy. A block nobody holds keeps
its prefix, cached, until the pool needs it: free blocks are used first, then the least recently
released cached ones (LRU). `queried_tokens` / `hit_tokens` count prompt tokens looked up and served.
Not here: the tensors (batch_kv), who is admitted when (draftwheel.serving.engine.scheduler).
"""

from __future__ import annotations

import bisect
from collections import OrderedDict


class OutOfBlocksError(RuntimeError):
    """The pool has fewer free blocks than asked for."""


class BlockManager:
    def __init__(self, n_blocks: int, block_size: int, prefix_caching: bool = False):
        if n_blocks < 1 or block_size < 1:
            raise ValueError(f"kv_blocks and kv_block_size must be >= 1, got {n_blocks} and {block_size}")
        self.n_blocks, self.block_size, self.prefix_caching = n_blocks, block_size, prefix_caching
        self._free: list[int] = list(range(n_blocks))  # sorted; no prefix in them
        self._refs = [0] * n_blocks
        self._cached: OrderedDict[int, None] = OrderedDict()  # held by nobody, prefix kept: oldest first
        self._key: dict[int, tuple[int, tuple[int, ...]]] = {}  # block -> (block before it or -1, its tokens)
        self._by_key: dict[tuple[int, tuple[int, ...]], int] = {}
        self._after: dict[int, set[int]] = {}  # block -> the blocks registered right after it
        self.queried_tokens = self.hit_tokens = 0

    @property
    def free_blocks(self) -> int:
        return len(self._free) + len(self._cached)

    def blocks_for(self, n_positions: int) -> int:
        return -(-n_positions // self.block_size)

    def _shared(self, prompt: list[int] | None) -> list[int]:
        """The registered blocks holding the longest prefix of `prompt` in whole blocks, leaving its last
        token to compute."""
        if not (self.prefix_caching and prompt):
            return []
        blocks, previous = [], -1
        for i in range((len(prompt) - 1) // self.block_size):
            previous = self._by_key.get((previous, tuple(prompt[i * self.block_size:(i + 1) * self.block_size])))
            if previous is None:
                break
            blocks.append(previous)
        return blocks

    def can_allocate(self, n_positions: int, prompt: list[int] | None = None) -> bool:
        shared = self._shared(prompt)
        return self.blocks_for(n_positions) - sum(self._refs[b] > 0 for b in shared) <= self.free_blocks

    def allocate(self, n_positions: int, prompt: list[int] | None = None) -> tuple[list[int], int]:
        """(block table for `n_positions` positions, positions already computed: the shared prefix's).
        With `prompt` and prefix caching, its registered leading blocks are shared. Raises
        OutOfBlocksError when the pool is short."""
        if not self.can_allocate(n_positions, prompt):
            raise OutOfBlocksError(f"{self.blocks_for(n_positions)} KV blocks needed, {self.free_blocks} free")
        shared = self._shared(prompt)
        for block in shared:
            self._cached.pop(block, None)
            self._refs[block] += 1
        table = shared + self._take(self.blocks_for(n_positions) - len(shared))
        if self.prefix_caching and prompt:
            self.queried_tokens += len(prompt)
            self.hit_tokens += len(shared) * self.block_size
        return table, len(shared) * self.block_size

    def _take(self, n: int) -> list[int]:
        """n blocks nobody holds: one run of consecutive free ones if there is one, else the lowest free,
        then the least recently released cached ones (their prefixes forgotten)."""
        free = self._free
        if len(free) >= n:
            start = next((i for i in range(len(free) - n + 1) if free[i + n - 1] - free[i] == n - 1), 0)
            taken = free[start:start + n]
            del free[start:start + n]
        else:
            taken, free[:] = free[:], []
            while len(taken) < n:
                block, _ = self._cached.popitem(last=False)
                self._forget(block)
                taken.append(block)
        for block in taken:
            self._refs[block] = 1
        return taken

    def _forget(self, block: int) -> None:
        """Unregister a block and every block registered after it (cached ones become plain free blocks)."""
        key = self._key.pop(block)
        del self._by_key[key]
        self._after.get(key[0], set()).discard(block)
        for later in self._after.pop(block, set()):
            self._forget(later)
            if self._cached.pop(later, 0) is None:
                bisect.insort(self._free, later)

    def register(self, table: list[int], prompt: list[int]) -> None:
        """The prompt is in the table's blocks: make its full blocks findable by later prompts."""
        if not self.prefix_caching:
            return
        previous = -1
        for i in range(len(prompt) // self.block_size):
            key = (previous, tuple(prompt[i * self.block_size:(i + 1) * self.block_size]))
            if key not in self._by_key and table[i] not in self._key:
                self._key[table[i]], self._by_key[key] = key, table[i]
                self._after.setdefault(previous, set()).add(table[i])
            previous = self._by_key.get(key, table[i])

    def release(self, table: list[int]) -> None:
        """Give a request's blocks back (its table is emptied, so a second release is a no-op). A block
        still held by another request stays; one holding a registered prefix is kept, cached."""
        for block in reversed(table):  # its last blocks first: the least recently used are a prompt's ends
            self._refs[block] -= 1
            if self._refs[block] > 0:
                continue
            if block in self._key:
                self._cached[block] = None
            else:
                bisect.insort(self._free, block)
        table.clear()
