"""A causal LM paired with its KV cache: prefill, extend, and roll back by cropping.

`CachedLM` keeps one HF `DynamicCache` for one request; the decoding loops reach its forward through
`step`, a generator, so that the batch engine can stand a paged row in its place. Rolling back after a rejected draft crops the
cache (`DynamicCache.crop`), so the accepted prefix is never re-encoded. It owns no decoding policy.
Timing of forwards (for the adaptive-k cost ratio) is measured here because only here is each forward
visible; on CPU the wall clock around a forward is its cost (no asynchronous kernels to wait for).
"""

from __future__ import annotations

import time
from contextlib import nullcontext

import torch
from transformers import DynamicCache

from draftwheel.serving.engine.row_invariant import tree_layout
from draftwheel.serving.engine.tree import Tree


class CachedLM:
    supports_trees = True  # `step(..., tree=)`, `keep_path` (a batched row has both too: batching.PagedRow)

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.device = next(model.parameters()).device
        self.last_forward_s = 0.0

    @property
    def length(self) -> int:
        """Tokens currently held in the cache."""
        return self.cache.get_seq_length()

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, keep: int = 0, hidden: bool = False,
                aux: list[int] | None = None, tree: Tree | None = None):
        """Append input_ids[T] to the cache; return logits[T', V] for the last `keep` positions (0 = all).

        With `hidden=True` also return the last hidden state[T, H] (Medusa heads read it); with `aux`
        layer ids, the inputs of those layers concatenated, [T, len(aux)*H] (EAGLE-3 drafts read them;
        id i is HF `hidden_states[i]`, as vLLM numbers them). Both stay on the model's device. Logits
        come back on the CPU, where verification and sampling run with the request's CPU generator
        (a no-op copy for CPU models). With `tree`, input_ids are its nodes' tokens (module docstring).
        """
        start = time.perf_counter()
        positions = None
        if tree is not None:
            positions = (self.length + torch.tensor(tree.depths)).to(self.device).unsqueeze(0)  # [1, T]
        with tree_layout(tree.visible()) if tree is not None else nullcontext():
            out = self.model(
                input_ids=input_ids.to(self.device).unsqueeze(0), position_ids=positions, cache=self.cache,
                use_cache=True, logits_to_keep=keep, output_hidden_states=hidden or bool(aux),
            )
        self.last_forward_s = time.perf_counter() - start
        logits = out.logits[0].cpu()  # [T', V]
        if aux:
            return logits, torch.cat([out.hidden_states[i][0] for i in aux], -1)
        return (logits, out.hidden_states[-1][0]) if hidden else logits

    def step(self, input_ids: torch.Tensor, keep: int = 0, hidden: bool = False, aux: list[int] | None = None,
             tree: Tree | None = None):
        """`forward` as the decoding loops call it, `logits = yield from target.step(...)`: here it never
        suspends; a batched row (draftwheel.serving.engine.batching.PagedRow) suspends there until the
        batch's one forward has run."""
        return self.forward(input_ids, keep, hidden, aux, tree)
        yield  # unreachable: makes this a generator the loops can delegate to

    def rollback(self, n_tokens: int) -> None:
        """Forget the last `n_tokens` cached positions (a no-op for 0)."""
        if n_tokens > 0:
            # transformers 5: a negative argument is the number of tokens to remove.
            self.cache.crop(-n_tokens)

    def keep_path(self, nodes: int, path: list[int]) -> None:
        """After a tree verify of `nodes` nodes: keep the cached positions of the nodes on `path` (ascending,
        the root first), in order, and drop the other nodes'."""
        if path == list(range(len(path))):  # a prefix of the nodes: the usual roll-back
            self.rollback(nodes - len(path))
            return
        past = self.length - nodes
        keep = torch.tensor(path, device=self.device) + past
        for layer in self.cache.layers:
            layer.keys = torch.cat([layer.keys[..., :past, :], layer.keys[..., keep, :]], -2)
            layer.values = torch.cat([layer.values[..., :past, :], layer.values[..., keep, :]], -2)
