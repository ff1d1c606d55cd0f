"""Calibrating an eagle3 draft's confidence for serving's chain cut (temperature scaling).

Serving stops a greedy chain once the product of the draft's top-1 probabilities falls below
`min_path_prob` (draftwheel.serving.engine.eagle_decoding._run_ahead): that product stands for the chance that
the target accepts the whole chain. A draft fine-tuned on a round's narrow traffic with a sharpened
teacher (eagle.yaml's `teacher_temperature`) can come out more confident than it is right: its chains
run long and their last tokens are rejected, each costing a draft step and a verify row. One scalar T,
chosen on the training probe's teacher-forced chains by the likelihood of "the target agreed" under the
top-1 probability of softmax(logits / T), puts the confidence back on the agreement rate (temperature
scaling, Guo et al. 2017). The argmax, and so every drafted token, stays as it was: only where chains
stop moves.

`fit_temperature(draft, dataset, k)` returns the chosen T with the figures that justify it; it does not
change the draft (train_eagle stores T in the draft's config, `Eagle3Config.confidence_temperature`).
"""

from __future__ import annotations

from typing import Any

import torch

from draftwheel.training.eagle_ttt import chain_steps, unroll

GRID = tuple(2.0 ** (e / 8) for e in range(-12, 17))
"""Temperatures tried: 0.35 to 4 in steps of 2^(1/8) (~9 %), 1.0 among them."""
MIN_POSITIONS = 64
"""Fewer probe positions than this: no fit, the temperature stays 1.0 (too little evidence to move it)."""


def fit_temperature(draft: Any, dataset: Any, k: int, collate: Any, batch_size: int = 8,
                    bf16: bool = False) -> dict[str, float]:
    """The temperature on `GRID` with the least binary cross-entropy of agreement, over every chain
    position the draft reaches teacher-forced (step s of a chain counts while steps 0..s-1 agreed with
    the target's greedy tokens, as in serving). Returns {"confidence_temperature", "positions",
    "agreement" (the share of those positions where the target agreed), "confidence_before" /
    "confidence_after" (mean top-1 probability at T = 1 and at the chosen T), "nll_before" / "nll_after"}."""
    nll = torch.zeros(len(GRID), dtype=torch.float64)
    confidence = torch.zeros(len(GRID), dtype=torch.float64)
    positions = agreed = 0
    temperatures = torch.tensor(GRID).view(-1, 1, 1)  # [G, 1, 1]
    was_training = draft.training
    draft.eval()
    with torch.no_grad(), torch.autocast(draft.fc.weight.device.type, dtype=torch.bfloat16, enabled=bf16):
        for start in range(0, len(dataset), batch_size):
            batch = collate([dataset[i] for i in range(start, min(len(dataset), start + batch_size))])
            step_logits = unroll(draft, batch["input_ids"], batch["aux"], k)
            for logits, reached, agrees in chain_steps(step_logits, batch["argmax"], draft, batch["mask"]):
                y = agrees[reached].to(torch.float64)  # [m]
                if not y.numel():
                    continue
                z = logits.float()[reached]  # [m, Vd]
                top = torch.softmax(z.unsqueeze(0) / temperatures, -1).amax(-1).double()  # [G, m]
                top = top.clamp(1e-6, 1 - 1e-6)
                nll -= (y * top.log() + (1 - y) * (1 - top).log()).sum(-1)
                confidence += top.sum(-1)
                positions, agreed = positions + y.numel(), agreed + int(y.sum())
    draft.train(was_training)
    one = GRID.index(1.0)
    best = int(nll.argmin()) if positions >= MIN_POSITIONS else one
    per = lambda values, i: float(values[i]) / positions if positions else 0.0
    return {"confidence_temperature": GRID[best], "positions": float(positions),
            "agreement": agreed / positions if positions else 0.0,
            "confidence_before": per(confidence, one), "confidence_after": per(confidence, best),
            "nll_before": per(nll, one), "nll_after": per(nll, best)}


def describe(fit: dict[str, float]) -> str:
    """One line for the training log."""
    return (f"[eagle] confidence temperature {fit['confidence_temperature']:.2f}: mean top-1 probability "
            f"{fit['confidence_before']:.3f} -> {fit['confidence_after']:.3f} against agreement "
            f"{fit['agreement']:.3f} over {fit['positions']:.0f} probe chain positions"
            f" (log-loss {fit['nll_before']:.3f} -> {fit['nll_after']:.3f})")

