"""Attention whose result for a token does not depend on how many tokens are computed together.

Why: greedy speculative decoding is lossless only if the target's verification forward over k+1 tokens
picks, at every position, the token a 1-token decoding step would pick. The linear layers already
give bitwise the same row whether they see 1 row or k+1 (measured for the oneDNN and MKL kernels, in
float32 and bfloat16). PyTorch's CPU attention does not: with several query rows it takes a different
kernel (blocked over queries, with a causal mask) than with one, and in bfloat16 the difference in
rounding flips near-tied tokens (12 of 16 held-out chat prompts diverged from plain decoding on the
reference target). Serving stacks call this batch invariance (vLLM's batch-invariant mode,
Thinking Machines' "Defeating Nondeterminism in LLM Inference").

`row_invariant_attention` computes a short multi-row call on a cache (a verify: 2..MAX_ROWS queries
after at least one cached position, batch 1, no padding) as one `sdpa` call per query row over exactly
the keys that row may see, which is the very call a 1-token decoding step makes at that position, so
the result is bitwise the same by construction. Those calls (`sdpa_call`) skip transformers' copies of
the keys and values per query head, and in bfloat16 on a CPU they compute in float32 (`work_dtype`).
Prefills (no cache: the same call in every mode) and calls over MAX_ROWS go to transformers' `sdpa`
unchanged. The price is a few small calls per layer per verify.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

import torch
from torch import nn
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

log = logging.getLogger(__name__)

NAME = "draftwheel_row_invariant"
MAX_ROWS = 64  # verify forwards: k+1 <= 33 rows, a suffix proposal 1 + max_spec_tokens (< 64); longer is a prefill

# A tree verify's layout: the branches (the rows each sees, as index tensors), and per row None where it
# sees every row before it (the chain), else (its branch, how many of the branch's rows it sees).
_TREE: ContextVar[tuple[list[torch.Tensor], list[tuple[int, int] | None]] | None] = ContextVar(
    "draftwheel_tree_layout", default=None)


@contextmanager
def tree_layout(visible: list[list[int]]) -> Iterator[None]:
    """Within this block a verify's row i attends to the cache and the rows `visible[i]` (ascending, ending
    with i) instead of every row up to i. Rows whose lists are prefixes of one branch's share that
    branch's gathered keys, so each layer gathers once per branch, not once per row."""
    if len(visible) > MAX_ROWS:
        raise ValueError(f"a tree verify has {len(visible)} rows; at most {MAX_ROWS} stay row-invariant")
    branches: list[list[int]] = []
    rows: list[tuple[int, int] | None] = [None] * len(visible)
    for i in reversed(range(len(visible))):  # deeper rows first: a branch is found before its prefixes
        seen = visible[i]
        if seen == list(range(i + 1)):
            continue
        branch = next((b for b, rows_seen in enumerate(branches) if rows_seen[:len(seen)] == seen), None)
        if branch is None:
            branches.append(seen)
            branch = len(branches) - 1
        rows[i] = (branch, len(seen))
    token = _TREE.set(([torch.tensor(b) for b in branches], rows))
    try:
        yield
    finally:
        _TREE.reset(token)


def work_dtype(query: torch.Tensor) -> torch.dtype:
    """The dtype an attention call of `query`[B, H, n, D] computes in: float32 for a short call (n up to
    MAX_ROWS) in bfloat16 on a CPU, else the query's own.

    PyTorch's bfloat16 CPU attention kernel has a large fixed cost per call and grows steeply with the
    keys: one query over 150 cached positions of the reference target took ~92 µs against ~16 µs in
    float32, and a layer's 9 verify rows at 600 positions 3.2 ms against 0.54 ms with the upcasts
    (2-core AMD EPYC, AVX-512 BF16). Verify rows are one call each (module docstring), so in bfloat16
    that kernel made every extra verify row cost ~10 % of a decoding step. The upcasts are exact and the
    result is rounded back to bfloat16; a decoding step and a verify row still make the same call. Long
    calls (a batched prompt chunk) keep the bfloat16 kernel: at 512 query rows over 1024 keys it took
    8.8 ms against 10.5 ms upcast."""
    short = query.shape[-2] <= MAX_ROWS
    return torch.float32 if short and query.dtype == torch.bfloat16 and query.device.type == "cpu" else query.dtype


def sdpa_call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None = None,
              scaling: float | None = None, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """`sdpa_attention_forward`'s call for a query after a cache, in `work_dtype`, without its copies of the
    keys and values per query head: grouped-query heads go to sdpa as they are (`enable_gqa`), which
    saves 60 µs per layer of a short call. query[B, H, n, D] -> out[B, n, H, D] in `out_dtype` (default
    the query's: pass the original dtype when the inputs were upcast once for several calls)."""
    out_dtype = out_dtype or query.dtype
    work = work_dtype(query)
    out = torch.nn.functional.scaled_dot_product_attention(query.to(work), key.to(work), value.to(work),
                                                           attn_mask=mask, scale=scaling,
                                                           enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).to(out_dtype).contiguous()


def upcast(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The three in `work_dtype`, converted once for a verify's per-row calls."""
    work = work_dtype(query)
    return query.to(work), key.to(work), value.to(work)


Reads = Callable[[int, torch.Tensor, torch.Tensor], "tuple[torch.Tensor, torch.Tensor] | None"]


def per_row_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, past: int,
                      scaling: float | None = None, reads: Reads | None = None) -> torch.Tensor:
    """One `sdpa_call` per query row: query[1, H, n, D] over key/value[1, KVH, past + n, D] ->
    out[1, n, H, D] in the query's dtype, the three converted to `work_dtype` once. Row i reads the first
    past + i + 1 keys, the very call a one-token decoding step makes at its position, unless
    `reads(i, key, value)` returns other keys and values (a tree node off the chain: the cache and its
    own ancestors)."""
    out_dtype = query.dtype
    query, key, value = upcast(query, key, value)
    outs = []
    for i in range(query.shape[2]):
        own = reads(i, key, value) if reads is not None else None
        k, v = own if own is not None else (key[:, :, :past + i + 1], value[:, :, :past + i + 1])
        outs.append(sdpa_call(query[:, :, i:i + 1], k, v, None, scaling, out_dtype))
    return torch.cat(outs, dim=1)


def row_invariant_attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
    """query[B, H, Q, D], key/value[B, KVH, past+Q, D] (the cache plus these Q positions) ->
    (out[B, Q, H, D], None), as `sdpa_attention_forward` returns."""
    batch, _, rows, _ = query.shape
    past = key.shape[2] - rows
    # A prefill (no cache yet) is the same call in every mode, so it needs no invariance; per-row calls
    # would make it several times slower and its numerics unlike HF's (greedy 8/16 vs HF in bfloat16).
    tree = _TREE.get()
    if tree is not None and (len(tree[1]) != rows or batch != 1 or past == 0):
        raise ValueError(f"a tree verify of {len(tree[1])} nodes needs batch 1, a cache and one row per node "
                         f"(got batch {batch}, {past} cached, {rows} rows)")
    if rows > MAX_ROWS or batch != 1 or past == 0:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    # Batch 1 has no padding, so row i sees exactly the first past+i+1 keys: no mask needed; a decoding
    # step (one row) makes the very call.
    if tree is None:
        return per_row_attention(query, key, value, past, kwargs.get("scaling")), None
    branches, layout = tree
    gathered: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # per branch: the cache and its rows, once a layer

    def reads(i: int, key: torch.Tensor, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        if layout[i] is None:
            return None
        branch, seen = layout[i]
        if branch not in gathered:
            rows_of = past + branches[branch]
            gathered[branch] = (torch.cat([key[:, :, :past], key[:, :, rows_of]], 2),
                                torch.cat([value[:, :, :past], value[:, :, rows_of]], 2))
        k, v = gathered[branch]
        return k[:, :, :past + seen], v[:, :, :past + seen]

    return per_row_attention(query, key, value, past, kwargs.get("scaling"), reads), None


AttentionInterface.register(NAME, row_invariant_attention)
AttentionMaskInterface.register(NAME, sdpa_mask)  # the masks sdpa gets (None where it can skip one)


def use_row_invariant_attention(model: nn.Module) -> bool:
    """Switch a transformers model that uses sdpa to row-invariant attention, in place; return whether it
    did (models on another attention implementation, or with their own attention code, are left as is)."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) not in ("sdpa", NAME):
        return False
    try:
        model.set_attn_implementation(NAME)
    except (ValueError, AttributeError) as exc:  # a model whose attention does not use the interface
        log.warning("row-invariant attention not available for %s: %s", type(model).__name__, exc)
        return False
    return model.config._attn_implementation == NAME


def use_stock_attention(model: nn.Module) -> None:
    """The inverse, for running HF `generate` as users run it."""
    if getattr(getattr(model, "config", None), "_attn_implementation", None) == NAME:
        model.set_attn_implementation("sdpa")
