"""A paged KV cache and the batched target forward over it: many requests, one forward per step.

Memory: `KVPool` preallocates, per layer, keys and values for `n_blocks` blocks of `block_size` token
slots ([KVH, n_blocks * block_size, D]); a request owns a block table (`draftwheel.serving.engine.blocks`
hands the blocks out) and its position p lives in slot `table[p // block_size] * block_size + p % block_size`.

Compute: `PagedRunner.forward(calls)` packs every row's new tokens into one sequence [1, T] (each token
with its own position id), so the linear layers run once for the whole batch, and the transformers
attention `draftwheel_paged` (registered here like `draftwheel.serving.engine.row_invariant`) writes
each row's new keys/values into its slots, gathers the row's keys by its block table and runs the same
`sdpa` calls a single request would make on its own cache: a prefill chunk with no past is one causal
call, a decoding row one call over its keys, a longer chunk after a past one call with its causal mask,
and a verify (2..MAX_ROWS rows after a past) one call per query row when it is the forward's only row
(row-invariant: bitwise the decoding steps), else one masked call (in a batch the linear layers already
round by the batch's rows, and per-query-row calls would cost a verify's rows times the layers). So a
row's attention is what it would be alone (rows never see each other's keys or padding), bitwise for a
forward of one row. Outside a batched forward (no `paged` argument) the attention is the row-invariant
one, so one model serves both paths.

A token tree (draftwheel.serving.engine.tree: the draft's chain with its runner-up or the index's proposal
beside it) is a verify whose rows see their ancestors instead of every row before them, at positions by
depth: alone in its forward, one call per node over the cache and exactly its ancestors' keys (bitwise
the decoding step it stands for), in a batch one call with the tree's mask.

Rolling a row back (a rejected draft) is only its length going down: later writes overwrite the slots.
After a tree, `keep_path` copies the accepted nodes' keys and values down to consecutive positions.
Not here: which requests run (draftwheel.serving.engine.scheduler), decoding policy, block accounting.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from draftwheel.serving.engine.row_invariant import MAX_ROWS, per_row_attention, row_invariant_attention, sdpa_call
from draftwheel.serving.engine.tree import Tree

NAME = "draftwheel_paged"


class KVPool:
    """Keys and values of every layer for `n_blocks` blocks of `block_size` positions, allocated once."""

    def __init__(self, config, n_blocks: int, block_size: int, dtype: torch.dtype, device: str | torch.device = "cpu"):
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        shape = (config.num_key_value_heads, n_blocks * block_size, head_dim)
        self.n_blocks, self.block_size = n_blocks, block_size
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.keys + self.values)

    def slots(self, table: list[int], end: int, start: int = 0) -> torch.Tensor:
        """Slot ids of positions start..end-1 of a request with block `table` -> [end - start] long."""
        return self.slots_of(table, torch.arange(start, end))

    def slots_of(self, table: list[int], positions: torch.Tensor) -> torch.Tensor:
        """Slot ids of `positions` [N] long of a request with block `table` -> [N] long."""
        blocks = torch.tensor(table, dtype=torch.long)[positions // self.block_size]
        return blocks * self.block_size + positions % self.block_size

    def keep_path(self, table: list[int], past: int, path: list[int]) -> None:
        """After a tree verify of a request at `past` cached positions: its node `path[j]` (ascending) moves
        to position past + j, in every layer. Reads come before writes (advanced indexing copies), and
        path[j] >= j, so no node is overwritten before it is read."""
        source = self.slots_of(table, torch.tensor(path) + past)
        target = self.slots(table, past + len(path), past)
        for keys, values in zip(self.keys, self.values):
            keys[:, target] = keys[:, source]
            values[:, target] = values[:, source]

    def span(self, table: list[int], end: int) -> tuple[int, int] | None:
        """(first, last + 1) slot of positions 0..end-1 when their blocks are consecutive in the pool (then
        the row's keys are read in place, a view), else None (gathered by slot)."""
        used = table[:-(-end // self.block_size)]
        if any(b != used[0] + i for i, b in enumerate(used)):
            return None
        first = used[0] * self.block_size
        return first, first + end


@dataclass
class TreeRead:
    """The keys a tree verify's nodes read: node i sees the cache and its ancestors. The same in every
    layer, so built once per forward (`of`), not in each layer's attention."""
    mask: torch.Tensor  # [1, 1, n, past + n] bool: in a batch, one call with this mask
    gathers: list[torch.Tensor | None]  # alone, per node: the key positions its call reads; None on the chain (a prefix)

    @classmethod
    def of(cls, tree: Tree, past: int, device: torch.device | str = "cpu") -> "TreeRead":
        visible = tree.visible()
        n = len(visible)
        mask = torch.zeros(n, past + n, dtype=torch.bool, device=device)
        mask[:, :past] = True
        gathers: list[torch.Tensor | None] = []
        for i, seen in enumerate(visible):
            own = past + torch.tensor(seen, device=device)
            mask[i, own] = True
            gathers.append(None if seen == list(range(i + 1)) else torch.cat([torch.arange(past, device=device), own]))
        return cls(mask.view(1, 1, n, past + n), gathers)


@dataclass
class RowView:
    """One row of a batched forward, as the attention sees it."""
    start: int  # offset of its new tokens in the packed sequence
    n: int  # its new tokens
    past: int  # positions already cached before them
    read: torch.Tensor | tuple[int, int]  # [past + n] slots of all its positions in order, or their span
    tree: TreeRead | None = None  # a tree verify's reads; None = a chain


@dataclass
class PagedBatch:
    """The `paged` argument of a batched forward: where every row's keys live."""
    pool: KVPool
    rows: list[RowView]
    write: torch.Tensor  # [T] slot of every new token, packed order


def _tree_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past: int, tree: TreeRead,
                    alone: bool, scaling: float | None) -> torch.Tensor:
    """A tree verify's attention: node i sees the cache, its ancestors and itself. Alone, one call per node
    over exactly those keys, as `row_invariant` computes a tree: bitwise the decoding step the node
    stands for. In a batch, one call with the tree's mask."""
    if not alone:
        return sdpa_call(query, key, value, tree.mask, scaling)

    def reads(i: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        keep = tree.gathers[i]  # None on the chain: the rows before it, as a verify reads them; else (a
        # runner-up, the index's branch) the cache and its own ancestors
        return None if keep is None else (key.index_select(2, keep), value.index_select(2, keep))

    return per_row_attention(query, key, value, past, scaling, reads)


def _row_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                   past: int, alone: bool, tree: TreeRead | None = None, **kwargs) -> torch.Tensor:
    """query[1, H, n, D] over key/value[1, KVH, past + n, D] -> out[1, n, H, D]: the calls one request makes."""
    n, scaling = query.shape[2], kwargs.get("scaling")
    if tree is not None:
        return _tree_attention(query, key, value, past, tree, alone, scaling)
    if past == 0:  # a first prefill chunk: causal, no mask
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)[0]
    if n == 1:  # a decoding step: the call a request alone makes (row_invariant)
        return sdpa_call(query, key, value, None, scaling)
    if n <= MAX_ROWS and alone:  # a verify: one call per query row over exactly its keys (row_invariant)
        return per_row_attention(query, key, value, past, scaling)
    # a later prefill chunk, or a verify in a batch (whose rows are not bitwise a request alone's anyway:
    # the linear layers see every row's tokens): causal over its own positions, everything before visible
    mask = torch.ones(n, past + n, dtype=torch.bool, device=query.device).tril(past).view(1, 1, n, past + n)
    return sdpa_call(query, key, value, mask, scaling)


def paged_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, paged: PagedBatch | None = None,
                    **kwargs) -> tuple[torch.Tensor, None]:
    """query[1, H, T, D], key/value[1, KVH, T, D] (the packed new tokens, RoPE applied) -> (out[1, T, H, D], None)."""
    if paged is None:  # an ordinary forward on a per-request cache
        return row_invariant_attention(module, query, key, value, attention_mask, **kwargs)
    keys, values = paged.pool.keys[module.layer_idx], paged.pool.values[module.layer_idx]
    keys[:, paged.write] = key[0]
    values[:, paged.write] = value[0]
    outs = []
    for row in paged.rows:
        if isinstance(row.read, tuple):  # consecutive blocks: a view
            row_keys, row_values = keys[None, :, row.read[0]:row.read[1]], values[None, :, row.read[0]:row.read[1]]
        else:
            row_keys = keys.index_select(1, row.read).unsqueeze(0)  # [1, KVH, past + n, D]
            row_values = values.index_select(1, row.read).unsqueeze(0)
        outs.append(_row_attention(module, query[:, :, row.start:row.start + row.n], row_keys, row_values,
                                   row.past, len(paged.rows) == 1, row.tree, **kwargs))
    return torch.cat(outs, dim=1), None


AttentionInterface.register(NAME, paged_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # used only outside batched forwards


def use_paged_attention(model: nn.Module) -> bool:
    """Switch a transformers sdpa model (or one on row-invariant attention) to `draftwheel_paged`, in place."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in ("sdpa", "draftwheel_row_invariant", NAME):
        return False
    model.set_attn_implementation(NAME)
    return model.config._attn_implementation == NAME


@dataclass
class RowCall:
    """One row's share of a batched forward: append `tokens` after `past` cached positions."""
    tokens: torch.Tensor  # [n] long
    past: int
    table: list[int]  # the request's block table (covers past + n positions)
    keep: int = 0  # logits for the last `keep` positions (0 = all)
    hidden: bool = False  # also the last hidden state [n, H]
    aux: list[int] | None = None  # also these layers' inputs, concatenated [n, len(aux) * H]
    tree: Tree | None = None  # `tokens` are this tree's nodes (a verify; never split into chunks)
    result: object = field(default=None, repr=False)


class PagedRunner:
    """Runs one target forward for a list of `RowCall`s over a `KVPool` (the model runner)."""

    def __init__(self, model: nn.Module, pool: KVPool):
        if not use_paged_attention(model):
            raise ValueError(f"{type(model).__name__}: paged attention needs an sdpa transformers model")
        self.model, self.pool = model, pool
        self.device = next(model.parameters()).device
        self.last_forward_s = 0.0

    @torch.inference_mode()
    def forward(self, calls: list[RowCall]) -> list[object]:
        """Run every call in one forward; each call's `result` (also returned, in order) is what
        `CachedLM.forward` returns for it: logits[keep, V] on the CPU, with hidden or aux states."""
        rows, keep_index, start = [], [], 0
        positions, writes = [], []
        for call in calls:
            n = call.tokens.shape[0]
            if call.tree is not None and len(call.tree) != n:
                raise ValueError(f"a tree of {len(call.tree)} nodes fed {n} tokens: a tree verify is never split")
            span = self.pool.span(call.table, call.past + n)
            rows.append(RowView(start, n, call.past, span or self.pool.slots(call.table, call.past + n),
                                TreeRead.of(call.tree, call.past, self.device) if call.tree is not None else None))
            writes.append(torch.arange(span[0] + call.past, span[1]) if span else rows[-1].read[call.past:])
            depths = torch.tensor(call.tree.depths) if call.tree is not None else torch.arange(n)
            positions.append(call.past + depths)
            keep = n if call.keep <= 0 else min(call.keep, n)
            keep_index.append(torch.arange(start + n - keep, start + n))
            start += n
        want_states = any(c.hidden or c.aux for c in calls)
        began = time.perf_counter()
        out = self.model(
            input_ids=torch.cat([c.tokens for c in calls]).to(self.device).unsqueeze(0),
            position_ids=torch.cat(positions).to(self.device).unsqueeze(0), use_cache=False,
            logits_to_keep=torch.cat(keep_index).to(self.device), output_hidden_states=want_states,
            paged=PagedBatch(self.pool, rows, torch.cat(writes).to(self.device)),
        )
        self.last_forward_s = time.perf_counter() - began
        logits = out.logits[0].cpu()  # [sum(keep), V]
        offset = 0
        for call, row, kept in zip(calls, rows, keep_index):
            mine = logits[offset:offset + kept.shape[0]]
            offset += kept.shape[0]
            span = slice(row.start, row.start + row.n)
            if call.aux:
                call.result = (mine, torch.cat([out.hidden_states[i][0, span] for i in call.aux], -1))
            elif call.hidden:
                call.result = (mine, out.hidden_states[-1][0, span])
            else:
                call.result = mine
        return [c.result for c in calls]
