"""Evaluation inside training: teacher-forced draft/target agreement on the hold-out.

One forward pass of the draft over each hold-out sequence (prompt + the target's output) gives, at every
output position, whether the draft's argmax equals the reference token: the target's argmax at that
prefix (when a target model is given) or the recorded output token (exact for greedy traffic, where the
output *is* the target's argmax). From the per-position matches we report
- `agreement`: the plain match rate `a`, and the implied mean accepted length `(1 - a^(k+1)) / (1 - a)`
  (i.i.d. acceptance assumption, Leviathan et al.);
- a greedy speculative-decoding replay: from position `s` the draft's own greedy continuation is
  accepted for as long as the matches run (capped at `k`), the step emits that run plus one target
  token, and the next step starts after it. This gives the per-position conditional acceptance
  (position 1..k) and the mean accepted length as the Engine counts it, `(accepted + steps) / steps`.

It does not run the Engine (that is `serving.shadow`'s job) and does not sample.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import TrainerCallback

from training.data import HoldoutExample


def implied_mean_accepted_length(a: float, k: int) -> float:
    """Expected tokens per verification step with i.i.d. per-token acceptance `a`: (1 - a^(k+1)) / (1 - a)."""
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"a must be in [0, 1], got {a}")
    return float(k + 1) if a == 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


def greedy_replay(matches: list[bool], k: int) -> tuple[list[int], list[int]]:
    """Replay greedy speculative decoding over one output's match flags.

    Returns (accepted count per step, drafted count per step).
    """
    accepted, drafted = [], []
    start = 0
    while start < len(matches):
        budget = min(k, len(matches) - start)
        run = 0
        while run < budget and matches[start + run]:
            run += 1
        accepted.append(run)
        drafted.append(budget)
        start += run + 1  # the accepted run plus the target's own (correction or bonus) token
    return accepted, drafted


def _argmax_over_outputs(model: Any, examples: list[HoldoutExample], batch_size: int, desc: str,
                         progress: bool) -> list[list[int]]:
    """Per example, the model's argmax at each position that predicts an output token."""
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    results: list[list[int]] = []
    batches = range(0, len(examples), batch_size)
    for start in tqdm(batches, desc=desc, disable=not progress, leave=False):
        chunk = examples[start:start + batch_size]
        seqs = [e.prompt_ids + e.output_ids for e in chunk]
        width = max(len(s) for s in seqs)
        ids = torch.tensor([s + [0] * (width - len(s)) for s in seqs], device=device)
        mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs], device=device)
        with torch.no_grad():
            argmax = model(input_ids=ids, attention_mask=mask).logits.argmax(-1).cpu()
        for row, example in enumerate(chunk):
            p = len(example.prompt_ids)
            results.append(argmax[row, p - 1:p - 1 + len(example.output_ids)].tolist())
    return results


def target_references(target: Any, examples: list[HoldoutExample], batch_size: int = 4,
                      progress: bool = True) -> list[list[int]]:
    """The target's argmax at every output position (compute once, reuse every epoch)."""
    was_training = target.training
    target.eval()
    refs = _argmax_over_outputs(target, examples, batch_size, "target argmax", progress)
    target.train(was_training)
    return refs


def evaluate_agreement(draft: Any, examples: list[HoldoutExample], k: int = 4,
                       references: list[list[int]] | None = None, batch_size: int = 4,
                       progress: bool = True) -> dict[str, float]:
    """Agreement and accepted-length figures of `draft` on `examples` (see module docstring)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    refs = references or [e.output_ids for e in examples]
    was_training = draft.training
    draft.eval()
    predictions = _argmax_over_outputs(draft, examples, batch_size, "draft agreement", progress)
    draft.train(was_training)
    total_matches = total_positions = 0
    accepted_steps: list[int] = []
    drafted_total = 0
    reached = [0] * (k + 1)   # reached[j]: steps in which position j was drafted with 1..j-1 accepted
    passed = [0] * (k + 1)    # passed[j]: ... and position j was accepted too
    for pred, ref in zip(predictions, refs):
        matches = [p == r for p, r in zip(pred, ref)]
        total_matches += sum(matches)
        total_positions += len(matches)
        accepted, drafted = greedy_replay(matches, k)
        accepted_steps += accepted
        drafted_total += sum(drafted)
        for acc, dra in zip(accepted, drafted):
            for j in range(1, min(acc + 1, dra) + 1):
                reached[j] += 1
                passed[j] += j <= acc
    a = total_matches / max(total_positions, 1)
    steps = max(len(accepted_steps), 1)
    metrics = {
        "agreement": a,
        "implied_mean_accepted_length": implied_mean_accepted_length(a, k),
        "replay_mean_accepted_length": (sum(accepted_steps) + len(accepted_steps)) / steps,
        "replay_acceptance_rate": sum(accepted_steps) / max(drafted_total, 1),
        "positions": float(total_positions),
    }
    for j in range(1, k + 1):
        metrics[f"acceptance_pos{j}"] = passed[j] / reached[j] if reached[j] else 0.0
    return metrics


class AgreementCallback(TrainerCallback):
    """Evaluates the model being trained on the hold-out after every epoch and logs it via the tracker."""

    def __init__(self, examples: list[HoldoutExample], tracker: Any, k: int = 4,
                 references: list[list[int]] | None = None, batch_size: int = 4):
        self.examples, self.tracker, self.k = examples, tracker, k
        self.references, self.batch_size = references, batch_size
        self.history: list[dict[str, float]] = []

    def _evaluate(self, state, model) -> None:
        if not state.is_world_process_zero or model is None:
            return
        metrics = evaluate_agreement(model, self.examples, self.k, self.references, self.batch_size)
        metrics["epoch"] = float(state.epoch or 0.0)
        self.history.append(metrics)
        self.tracker.log_metrics({f"eval_{name}": value for name, value in metrics.items()}, step=state.global_step)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._evaluate(state, model)  # the "before" point (epoch 0)

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        self._evaluate(state, model)


class TrackerCallback(TrainerCallback):
    """Forwards the Trainer's logged scalars (loss, learning rate, ...) to our tracker."""

    def __init__(self, tracker: Any):
        self.tracker = tracker

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            scalars = {f"train_{k}": float(v) for k, v in logs.items() if isinstance(v, (int, float))}
            self.tracker.log_metrics(scalars, step=state.global_step)
