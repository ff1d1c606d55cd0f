"""Verification of drafted tokens: pure tensor functions (no models, no caches, no I/O).

Both functions take the k drafted tokens and the target's scores at the k+1 positions that the single
verification forward produced (position i scores the token after draft token i-1; position k is the
bonus position), and return `(emitted_tokens, accepted_count)`: the accepted prefix of the draft plus
exactly one token chosen by the target, so 1 <= len(emitted) <= k + 1.
"""

from __future__ import annotations

import torch

from draftwheel.serving.engine.sampling import greedy


def point_mass_q(drafted: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """q[k, V] of a deterministic proposal (a suffix-index draft): one-hot, so `verify_sampled` accepts
    each token with probability p(x) and otherwise resamples from p without x."""
    return torch.nn.functional.one_hot(drafted, vocab_size).float()


def verify_greedy(draft_tokens: torch.Tensor, target_logits: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Accept the longest draft prefix equal to the target's argmax.

    draft_tokens[k] (long), target_logits[k+1, V] -> (emitted[accepted+1], accepted)
    """
    k = draft_tokens.shape[0]
    target_tokens = greedy(target_logits)  # [k+1]
    mismatch = (draft_tokens != target_tokens[:k]).long()  # [k]
    # cumsum stays 0 up to the first mismatch: its count is the accepted length.
    accepted = int((mismatch.cumsum(0) == 0).sum())
    return target_tokens[: accepted + 1], accepted


def verify_sampled(
    draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
    generator: torch.Generator | None,
) -> tuple[torch.Tensor, int]:
    """Standard speculative rejection sampling (Leviathan et al. 2023, Chen et al. 2023).

    Draft token x_i ~ q_i is accepted with probability min(1, p_i(x_i) / q_i(x_i)). At the first
    rejection the target's token is drawn from the residual norm(max(0, p_i - q_i)); if all k are
    accepted the bonus token is drawn from p_k. The emitted tokens are then distributed exactly as
    sampling from p one token at a time.

    draft_tokens[k], draft_probs[k, V], target_probs[k+1, V] -> (emitted[accepted+1], accepted)
    """
    k = draft_tokens.shape[0]
    idx = torch.arange(k)
    p_x = target_probs[idx, draft_tokens]  # [k]
    q_x = draft_probs[idx, draft_tokens]  # [k]
    u = torch.rand(k, generator=generator)  # [k]
    # u < p/q  <=>  u * q < p; avoids dividing by q (q(x) > 0 anyway since x was drawn from q).
    rejected = (u * q_x >= p_x).nonzero()
    if rejected.numel() == 0:
        bonus = torch.multinomial(target_probs[k], 1, generator=generator)  # [1]
        return torch.cat([draft_tokens, bonus]), k
    accepted = int(rejected[0, 0])
    residual = (target_probs[accepted] - draft_probs[accepted]).clamp_min(0)  # [V]
    total = residual.sum()
    # p == q at this position (possible only through float rounding): the residual is empty, fall back to p.
    residual = residual / total if total > 0 else target_probs[accepted]
    correction = torch.multinomial(residual, 1, generator=generator)  # [1]
    return torch.cat([draft_tokens[:accepted], correction]), accepted
