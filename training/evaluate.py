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
  (position 1..k) and the mean accepted length as the Engine counts it, `(accepted + steps) / steps`,
  pooled over steps and (`request_mean_accepted_length`) averaged over requests, as the shadow gate does.

All of these overall and per slice (`slice.<slice>.<metric>`). `AgreementCallback` evaluates before
training and after every epoch; with an `EpochSelection` it stops early and keeps the epoch that is
best for the shadow gate (no slice group losing more than a tolerance, then the largest gain), not
the one with the lowest training loss.

It does not run the Engine (that is `draftwheel.evaluation.shadow`'s job), does not sample, and holds no statistics
of its own: slice grouping comes from `draftwheel.evaluation.gate`.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import TrainerCallback

from draftwheel.evaluation.gate import slice_groups
from draftwheel.serving.engine.acceptance import acceptance_rate, mean_accepted_length
from draftwheel.serving.engine.sampling import greedy
from draftwheel.training.data import HoldoutExample

log = logging.getLogger(__name__)

SLICE_METRICS = ("agreement", "implied_mean_accepted_length", "replay_mean_accepted_length",
                 "request_mean_accepted_length", "examples")


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
            argmax = greedy(model(input_ids=ids, attention_mask=mask).logits).cpu()
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


def agreement_figures(match_lists: list[list[bool]], k: int) -> dict[str, float]:
    """Agreement and accepted-length figures of a set of outputs, from each output's match flags."""
    total_matches = total_positions = drafted_total = 0
    accepted_steps: list[int] = []
    request_lengths: list[float] = []
    reached = [0] * (k + 1)   # reached[j]: steps in which position j was drafted with 1..j-1 accepted
    passed = [0] * (k + 1)    # passed[j]: ... and position j was accepted too
    for matches in match_lists:
        total_matches += sum(matches)
        total_positions += len(matches)
        accepted, drafted = greedy_replay(matches, k)
        accepted_steps += accepted
        drafted_total += sum(drafted)
        if accepted:
            request_lengths.append(mean_accepted_length(sum(accepted), len(accepted)))
        for acc, dra in zip(accepted, drafted):
            for j in range(1, min(acc + 1, dra) + 1):
                reached[j] += 1
                passed[j] += j <= acc
    a = total_matches / max(total_positions, 1)
    metrics = {
        "agreement": a,
        "implied_mean_accepted_length": implied_mean_accepted_length(a, k),
        "replay_mean_accepted_length": mean_accepted_length(sum(accepted_steps), len(accepted_steps)),
        "request_mean_accepted_length": sum(request_lengths) / max(len(request_lengths), 1),
        "replay_acceptance_rate": acceptance_rate(sum(accepted_steps), drafted_total),
        "positions": float(total_positions),
        "examples": float(len(match_lists)),
    }
    for j in range(1, k + 1):
        metrics[f"acceptance_pos{j}"] = passed[j] / reached[j] if reached[j] else 0.0
    return metrics


def slice_key(slice_name: str, metric: str) -> str:
    """Flat key of a per-slice figure, e.g. `slice.code.agreement` (characters MLflow refuses become `_`)."""
    return f"slice.{re.sub(r'[^A-Za-z0-9_-]', '_', slice_name)}.{metric}"


def evaluate_agreement(draft: Any, examples: list[HoldoutExample], k: int = 4,
                       references: list[list[int]] | None = None, batch_size: int = 4,
                       progress: bool = True) -> dict[str, float]:
    """Agreement and accepted-length figures of `draft` on `examples` (see module docstring), overall and,
    under `slice_key(slice, metric)`, per slice for the metrics in SLICE_METRICS."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    refs = references or [e.output_ids for e in examples]
    was_training = draft.training
    draft.eval()
    predictions = _argmax_over_outputs(draft, examples, batch_size, "draft agreement", progress)
    draft.train(was_training)
    match_lists = [[p == r for p, r in zip(pred, ref)] for pred, ref in zip(predictions, refs)]
    metrics = agreement_figures(match_lists, k)
    for name in sorted({e.slice for e in examples}):
        figures = agreement_figures([m for m, e in zip(match_lists, examples) if e.slice == name], k)
        metrics.update({slice_key(name, metric): figures[metric] for metric in SLICE_METRICS})
    return metrics


@dataclass
class EpochSelection:
    """Which evaluation's weights to keep, judged as the shadow gate will judge them (docs/training.md).

    Each evaluation is compared with the first (before training, the starting draft) on
    `request_mean_accepted_length` (the mean over requests of each request's replayed accepted length,
    what the gate averages), per slice group: every slice with `min_slice_examples` examples, and the
    pool of the smaller ones if it has that many (`draftwheel.evaluation.gate.slice_groups`). An evaluation is
    *eligible* when no group dropped by more than `tolerance`; the best is the eligible one with the
    largest overall gain, or, if none is eligible, the one whose worst group dropped least."""

    tolerance: float = 0.05
    min_slice_examples: int = 10
    patience: int = 2
    """Evaluations in a row without a new best before training stops (0 = never stop early); it stops
    only in the second half of the planned steps."""
    keep_best: bool = True
    """At the end, put back the weights of the best evaluation (else keep the last)."""
    mixes: tuple[float, ...] = ()
    """After training, also judge these points on the line from the starting weights to the kept ones,
    `start + m * (kept - start)` with 0 < m < 1 (weight-space ensembling, WiSE-FT); where the kept
    weights lost a slice group, keep a mix that holds `mix_keep` of their gain instead (`best_mix`)."""
    mix_keep: float = 0.75
    """The share of the kept weights' overall gain a mix must hold to replace them."""


SELECTION_METRIC = "request_mean_accepted_length"


def _group_means(entry: dict[str, float], groups: dict[str, list[str]], counts: dict[str, int],
                 metric: str) -> dict[str, float]:
    """Per gating group, the example-weighted mean of its slices' `metric` in one evaluation."""
    return {group: sum(entry[slice_key(m, metric)] * counts[m] for m in members)
            / sum(counts[m] for m in members) for group, members in groups.items()}


def selection_scores(history: list[dict[str, float]], counts: dict[str, int],
                     rule: EpochSelection, metric: str = SELECTION_METRIC) -> list[dict[str, Any]]:
    """Per evaluation: overall and per-group relative change of `metric` vs the first evaluation, the worst
    group, and whether the evaluation is eligible (see EpochSelection)."""
    groups = {g: members for g, members in slice_groups(counts, rule.min_slice_examples).items()
              if sum(counts[m] for m in members) >= rule.min_slice_examples}
    base_groups, base = _group_means(history[0], groups, counts, metric), history[0][metric]
    scores = []
    for entry in history:
        changes = {g: (v / base_groups[g] - 1.0) if base_groups[g] else 0.0
                   for g, v in _group_means(entry, groups, counts, metric).items()}
        worst = min(changes, key=changes.get) if changes else ""
        worst_change = changes.get(worst, 0.0)
        scores.append({"epoch": entry["epoch"], "overall_change": entry[metric] / base - 1.0 if base else 0.0,
                       "group_changes": changes, "worst_group": worst, "worst_change": worst_change,
                       "eligible": worst_change >= -rule.tolerance})
    return scores


def _rank(score: dict[str, Any]) -> tuple[bool, float]:
    return score["eligible"], score["overall_change"] if score["eligible"] else score["worst_change"]


def best_mix(scores: list[dict[str, Any]], mixes: dict[int, float], keep: float) -> int:
    """The evaluation to keep of the kept weights (`mixes` value 1.0) and their mixes toward the start
    (evaluation index -> m). A mix is a remedy for forgetting: the kept weights stay unless some slice
    group lost against the start. Then, of the eligible mixes that hold `keep` of the kept weights'
    overall gain, the one with the largest gain among those that lost nothing, else the smallest step.

    Why not the largest gain alone: the probe sees a round's gain on its new slice far better than what
    the round costs the old ones, and the last part of the step buys little of the gain while moving the
    draft furthest from what served the old slices well (docs/training.md, "Weight mixes")."""
    kept = next(i for i, m in mixes.items() if m == 1.0)
    gain = scores[kept]["overall_change"]
    if gain <= 0 or not scores[kept]["eligible"] or scores[kept]["worst_change"] >= 0:
        return kept
    holding = [i for i, m in mixes.items() if m < 1.0 and scores[i]["eligible"]
               and scores[i]["overall_change"] >= keep * gain]
    clean = [i for i in holding if scores[i]["worst_change"] >= 0]
    if clean:
        return max(clean, key=lambda i: scores[i]["overall_change"])
    return min(holding, key=lambda i: mixes[i], default=kept)


def best_evaluation(scores: list[dict[str, Any]]) -> int:
    """Index of the best trained evaluation (index >= 1; the first is the baseline); 0 if none was trained."""
    return max(range(1, len(scores)), key=lambda i: _rank(scores[i]), default=0)


class EpochSelectionCallback(TrainerCallback):
    """Evaluates the model being trained on a hold-out before training and after every epoch, per slice
    (`measure`, per trainer), and logs it via the tracker. With an `EpochSelection` it also stops early
    when `patience` evaluations bring no new best on `metric`, and at the end puts back the best
    evaluation's trainable weights (kept on the CPU), re-evaluating them so the last history entry
    describes the saved model."""

    metric = SELECTION_METRIC

    def __init__(self, slices: list[str], tracker: Any, selection: EpochSelection | None = None):
        self.tracker, self.selection = tracker, selection
        self.counts = {name: slices.count(name) for name in set(slices)}
        self.history: list[dict[str, float]] = []
        self.scores: list[dict[str, Any]] = []
        self.best_index = 0
        self._best_weights: dict[str, torch.Tensor] | None = None
        self._start_weights: dict[str, torch.Tensor] | None = None

    def measure(self, model: Any) -> dict[str, float]:
        """Overall and per-slice (`slice_key`) figures of `model`, `metric` among them."""
        raise NotImplementedError

    def _evaluate(self, state, model, epoch: float | None = None) -> bool:
        if not state.is_world_process_zero or model is None:
            return False
        metrics = self.measure(model)
        metrics["epoch"] = float(state.epoch or 0.0) if epoch is None else epoch
        self.history.append(metrics)
        self.tracker.log_metrics({f"eval_{name}": value for name, value in metrics.items()}, step=state.global_step)
        return True

    def _select(self, args, state, control, model) -> None:
        self.scores = selection_scores(self.history, self.counts, self.selection, self.metric)
        latest = self.scores[-1]
        self.tracker.log_metrics({"eval_selection_overall_change": latest["overall_change"],
                                  "eval_selection_worst_change": latest["worst_change"],
                                  "eval_selection_eligible": float(latest["eligible"])}, step=state.global_step)
        if best_evaluation(self.scores) == len(self.scores) - 1:
            self.best_index = len(self.scores) - 1
            self._best_weights = _trainable(model)
        stale = len(self.scores) - 1 - self.best_index
        # Not in the first half of the planned steps: forgetting measured while the learning rate is still
        # high passes (the demo's round with two mined passes: chat -4.4, -5.0, -6.3 % at epochs 1-3, then
        # -4.4, -2.1, -2.2 %; stopping at epoch 3 kept epoch 1 and the gate rejected the round).
        second_half = 2 * state.global_step > state.max_steps
        # Only a single process may stop on its own: the others do not evaluate and would wait forever.
        if self.selection.patience and stale >= self.selection.patience and second_half and args.world_size == 1:
            log.info("early stop at epoch %.2f: %d evaluations without a better one than epoch %.2f",
                     latest["epoch"], stale, self.scores[self.best_index]["epoch"])
            control.should_training_stop = True

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        # the "before" point (epoch 0): the baseline of the selection, and one end of the mixes' line
        if self._evaluate(state, model) and self.selection is not None and self.selection.mixes:
            self._start_weights = _trainable(model)

    def on_epoch_end(self, args, state, control, model=None, **kwargs):
        if self._evaluate(state, model) and self.selection is not None:
            self._select(args, state, control, model)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if self.selection is None or not state.is_world_process_zero or model is None:
            return
        if self.selection.keep_best and self._best_weights is not None and self.best_index != len(self.history) - 1:
            _load(model, self._best_weights)
            epoch = self.history[self.best_index]["epoch"]
            log.info("kept the weights of epoch %.2f (best for the gate), not of the last epoch", epoch)
            self._evaluate(state, model, epoch)
            self.history[-1]["restored"] = 1.0
        if self._start_weights is not None and len(self.history) > 1:
            self._mix(state, model)

    def _mix(self, state, model) -> None:
        """Judge the mixes of the kept weights with the start (EpochSelection.mixes) and keep the best."""
        kept, start = _trainable(model), self._start_weights
        epoch = self.history[-1]["epoch"]
        mixes = {len(self.history) - 1: 1.0}
        for m in sorted(self.selection.mixes):
            _load(model, _mixed(start, kept, m))
            self._evaluate(state, model, epoch)
            self.history[-1]["mix"] = m
            mixes[len(self.history) - 1] = m
        self.scores = selection_scores(self.history, self.counts, self.selection, self.metric)
        chosen = best_mix(self.scores, mixes, self.selection.mix_keep)
        for i, m in mixes.items():
            s = self.scores[i]
            print(f"[selection] {m:.2f} of the way from the start to epoch {epoch:g}: overall {s['overall_change']:+.1%}, "
                  f"worst group {s['worst_group']} {s['worst_change']:+.1%}{' (kept)' if i == chosen else ''}", flush=True)
        if chosen == len(self.history) - 1:
            return
        _load(model, kept if mixes[chosen] == 1.0 else _mixed(start, kept, mixes[chosen]))
        self._evaluate(state, model, epoch)  # the last entry describes the saved weights
        self.history[-1]["mix"] = mixes[chosen]

    def summary(self) -> dict[str, Any]:
        """What was kept and why, for the candidate's training info."""
        return {"selected_epoch": self.history[-1]["epoch"] if self.history else None,
                "rule": asdict(self.selection) if self.selection else None, "metric": self.metric,
                "scores": self.scores}


def _trainable(model: Any) -> dict[str, torch.Tensor]:
    """A CPU copy of the model's trainable weights, as they are."""
    return {n: p.detach().to("cpu", copy=True) for n, p in model.named_parameters() if p.requires_grad}


def _mixed(start: dict[str, torch.Tensor], kept: dict[str, torch.Tensor], m: float) -> dict[str, torch.Tensor]:
    """start + m * (kept - start), computed in float32 (`_load` casts it back to each weight's dtype)."""
    return {name: start[name].float() + m * (kept[name].float() - start[name].float()) for name in kept}


def _load(model: Any, weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in weights:
                param.copy_(weights[name].to(param.device, param.dtype))


class AgreementCallback(EpochSelectionCallback):
    """Epoch selection on teacher-forced agreement (`evaluate_agreement`): the `lm` and Medusa drafts."""

    def __init__(self, examples: list[HoldoutExample], tracker: Any, k: int = 4,
                 references: list[list[int]] | None = None, batch_size: int = 4,
                 selection: EpochSelection | None = None):
        super().__init__([e.slice for e in examples], tracker, selection)
        self.examples, self.k, self.references, self.batch_size = examples, k, references, batch_size

    def measure(self, model: Any) -> dict[str, float]:
        return evaluate_agreement(model, self.examples, self.k, self.references, self.batch_size)


class TrackerCallback(TrainerCallback):
    """Forwards the Trainer's logged scalars (loss, grad norm, learning rate, epoch) to our tracker as
    `train_*`, at the global step, so MLflow charts them. The Trainer's own end-of-training summary
    (`train_runtime`, its mean `train_loss`, ...) is left out: the trainers log theirs (`common.log_summary`)."""

    def __init__(self, tracker: Any):
        self.tracker = tracker

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs:
            scalars = {f"train_{k}": float(v) for k, v in logs.items()
                       if isinstance(v, (int, float)) and not k.startswith("train_") and k != "total_flos"}
            self.tracker.log_metrics(scalars, step=state.global_step)
