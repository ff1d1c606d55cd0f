"""Distillation divergences between a teacher (target) and a student (draft), as pure functions of logits.

Every function takes `student_logits` and `teacher_logits` of shape `[..., V]`, an optional boolean
`mask` of shape `[...]` (True = position counts; e.g. completion tokens only), a softmax `temperature`
applied to both, and a `reduction`: `"mean"` (average over counted positions, the default), `"sum"`,
or `"none"` (the per-position divergence, summed over the vocabulary, shape `[...]`).

Conventions follow TRL's `GKDTrainer.generalized_jsd_loss` (Eq. 1 of Agarwal et al., 2306.13649):
`generalized_jsd(beta)` is `beta * KL(p || m) + (1 - beta) * KL(q || m)` with the mixture
`m = beta * p + (1 - beta) * q` (p = teacher, q = student); `beta == 0` is defined as the forward
KL(p || q) and `beta == 1` as the reverse KL(q || p), exactly as TRL special-cases them.

This module computes numbers only; it knows nothing about models, batches or caching.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

REDUCTIONS = ("mean", "sum", "none")


def _reduce(per_position: torch.Tensor, mask: torch.Tensor | None, reduction: str) -> torch.Tensor:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}")
    if reduction == "none":
        return per_position if mask is None else per_position * mask
    values = per_position if mask is None else per_position[mask.bool()]
    if reduction == "sum":
        return values.sum()
    # clamp: an all-masked batch gives 0 (with a gradient path), not 0/0 = nan.
    return values.sum() / max(values.numel(), 1)


def _log_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return F.log_softmax(logits.float() / temperature, dim=-1)


def _kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per position, summed over the vocabulary; 0 * log 0 terms count as 0."""
    p = log_p.exp()
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)


def forward_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor | None = None,
               temperature: float = 1.0, reduction: str = "mean") -> torch.Tensor:
    """KL(p_teacher || q_student): mass-covering; the standard KD objective."""
    per_position = _kl(_log_probs(teacher_logits, temperature), _log_probs(student_logits, temperature))
    return _reduce(per_position, mask, reduction)


def reverse_kl(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor | None = None,
               temperature: float = 1.0, reduction: str = "mean") -> torch.Tensor:
    """KL(q_student || p_teacher): mode-seeking."""
    per_position = _kl(_log_probs(student_logits, temperature), _log_probs(teacher_logits, temperature))
    return _reduce(per_position, mask, reduction)


def generalized_jsd(student_logits: torch.Tensor, teacher_logits: torch.Tensor, beta: float = 0.5,
                    mask: torch.Tensor | None = None, temperature: float = 1.0,
                    reduction: str = "mean") -> torch.Tensor:
    """Generalised Jensen-Shannon divergence with TRL's beta convention (see module docstring)."""
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must be in [0, 1], got {beta}")
    if beta == 0.0:
        return forward_kl(student_logits, teacher_logits, mask, temperature, reduction)
    if beta == 1.0:
        return reverse_kl(student_logits, teacher_logits, mask, temperature, reduction)
    log_q = _log_probs(student_logits, temperature)
    log_p = _log_probs(teacher_logits, temperature)
    log_m = torch.logsumexp(torch.stack([log_q + math.log1p(-beta), log_p + math.log(beta)]), dim=0)
    per_position = beta * _kl(log_p, log_m) + (1.0 - beta) * _kl(log_q, log_m)
    return _reduce(per_position, mask, reduction)


def total_variation(student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor | None = None,
                    temperature: float = 1.0, reduction: str = "mean") -> torch.Tensor:
    """Total variation distance `0.5 * sum |p - q|`; 1 - TVD is the greedy-free acceptance probability
    of speculative sampling, which is why DistillSpec found it a good target."""
    p = _log_probs(teacher_logits, temperature).exp()
    q = _log_probs(student_logits, temperature).exp()
    return _reduce(0.5 * (p - q).abs().sum(-1), mask, reduction)


LOSSES = {"fkl": forward_kl, "rkl": reverse_kl, "jsd": generalized_jsd, "tvd": total_variation}


def divergence(name: str, student_logits: torch.Tensor, teacher_logits: torch.Tensor,
               mask: torch.Tensor | None = None, temperature: float = 1.0, beta: float = 0.5,
               reduction: str = "mean") -> torch.Tensor:
    """Dispatch by loss name (`fkl`, `rkl`, `jsd`, `tvd`); `beta` is used by `jsd` only."""
    if name not in LOSSES:
        raise ValueError(f"loss must be one of {sorted(LOSSES)}, got {name!r}")
    if name == "jsd":
        return generalized_jsd(student_logits, teacher_logits, beta, mask, temperature, reduction)
    return LOSSES[name](student_logits, teacher_logits, mask, temperature, reduction)


def dense_logits_from_topk(top_logprobs: torch.Tensor, top_indices: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Rebuild full-vocabulary teacher log-probs from a cached top-k: the k kept log-probs in place and
    the remaining mass spread evenly over the other `V - k` tokens (a proper distribution, so every
    divergence above stays finite)."""
    k = top_logprobs.shape[-1]
    kept = top_logprobs.float().exp().sum(-1, keepdim=True).clamp(max=1.0)
    tail = torch.log((1.0 - kept).clamp_min(1e-12) / max(vocab_size - k, 1))
    dense = tail.expand(*top_logprobs.shape[:-1], vocab_size).clone()
    return dense.scatter(-1, top_indices.long(), top_logprobs.float())
