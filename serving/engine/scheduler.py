"""Continuous batching: which requests run, and how many of their tokens each forward takes. Pure Python.

Requests wait in one FIFO queue. Every step, `admit` moves the oldest waiting requests into the running
batch while it has fewer than `max_batch` rows and the KV pool can give the head of the queue every
block it may need (draftwheel.serving.engine.blocks); a request that does not fit yet holds the queue
(first come, first served: a long request is never overtaken forever). `plan` then picks the next
forward's rows under a token budget: every decoding row with its whole call (1 token, or the k + 1 of a
verify), then the prompts still being read, oldest first, in chunks of what is left of
`max_batch_tokens` (at least a quarter of it, so prompts keep moving while many rows decode), so a long
prompt never stalls the decoding rows. Requests leave the batch at any step: finished or cancelled,
their blocks go back to the pool at once. More than `max_waiting` queued requests are refused
(`QueueFullError`); a request the whole pool could never hold is refused when it is added.

Not here: tensors, models, decoding (draftwheel.serving.engine.batching runs the plan).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from draftwheel.serving.engine.blocks import BlockManager


class QueueFullError(RuntimeError):
    """The waiting queue is at `max_waiting`: the server answers 503 and the client retries."""


@dataclass(eq=False)
class Sequence:
    """One request as the scheduler sees it."""
    max_positions: int  # KV positions it may ever hold: prompt + max_new_tokens
    payload: Any = None  # the batch engine's state of the request
    prompt: list[int] | None = None  # its prompt's ids when it may share a cached prefix (blocks.py)
    cached: int = 0  # prompt positions found computed at admission (a shared prefix)
    table: list[int] = field(default_factory=list)  # its KV blocks, in position order
    length: int = 0  # positions in its KV cache
    pending: int = 0  # tokens of its current forward call not yet fed to the model
    keep: int = 1  # the call's last `keep` tokens must be fed together (the positions whose logits it reads)
    prefilling: bool = True  # its first call (the prompt) is not done yet
    running: bool = False


@dataclass
class SchedulerConfig:
    max_batch: int = 16
    max_batch_tokens: int = 512
    max_waiting: int = 256

    def __post_init__(self) -> None:
        for name in ("max_batch", "max_batch_tokens", "max_waiting"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)!r}")


class Scheduler:
    def __init__(self, blocks: BlockManager, config: SchedulerConfig | None = None):
        self.blocks, self.config = blocks, config or SchedulerConfig()
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []

    def add(self, seq: Sequence) -> None:
        """Queue a request; raises ValueError if the pool could never hold it, QueueFullError when full."""
        need, pool = self.blocks.blocks_for(seq.max_positions), self.blocks.n_blocks
        if need > pool:
            raise ValueError(f"max_tokens: prompt + max_tokens need {need} KV blocks of "
                             f"{self.blocks.block_size} positions; the pool has {pool} (kv_blocks)")
        if len(self.waiting) >= self.config.max_waiting:
            raise QueueFullError(f"server busy: {len(self.waiting)} requests already waiting (max_waiting)")
        self.waiting.append(seq)

    def admit(self) -> list[Sequence]:
        """Move waiting requests into the batch, FIFO, while rows and blocks allow; return them."""
        admitted = []
        while self.waiting and len(self.running) < self.config.max_batch \
                and self.blocks.can_allocate(self.waiting[0].max_positions, self.waiting[0].prompt):
            seq = self.waiting.popleft()
            seq.table, seq.cached = self.blocks.allocate(seq.max_positions, seq.prompt)
            seq.length = seq.cached
            seq.running = True
            self.running.append(seq)
            admitted.append(seq)
        return admitted

    def plan(self) -> list[tuple[Sequence, int]]:
        """The rows of the next forward: (sequence, tokens of its call to feed now)."""
        ready = [s for s in self.running if s.pending > 0]
        rows = [(s, s.pending) for s in ready if not s.prefilling]
        budget = self.config.max_batch_tokens
        left = max(budget - sum(n for _, n in rows), budget // 4)
        for seq in (s for s in ready if s.prefilling):
            if left <= 0:
                break
            n = min(seq.pending, left)
            if 0 < seq.pending - n < seq.keep:  # the positions whose logits are read go in one chunk
                n = seq.pending - seq.keep
                if n <= 0:  # the whole call is those positions: over budget rather than stalled
                    n = seq.pending
            rows.append((seq, n))
            left -= n
        return rows

    def remove(self, seq: Sequence) -> None:
        """A request leaves (finished, failed or cancelled, running or still waiting): its blocks go back."""
        if seq.running:
            self.running.remove(seq)
            seq.running = False
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq.table)
