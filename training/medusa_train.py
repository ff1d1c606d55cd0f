"""Medusa-1 head training on a frozen target (`draftwheel train medusa`).

The target stays frozen; only the heads' residual blocks learn (`draftwheel.serving.engine.medusa.MedusaHeads`). Data is
self-distillation: the `distill/` dataset's completions are the target's own outputs, and the loss for
head `i` at position `t` is either cross-entropy on the token at `t + i + 2` (`loss: ce`) or the KL from
the target's own distribution for that token (its logits at `t + i + 1`, `loss: kl`). Head losses are
weighted by `head_decay ** i` as in the Medusa paper, since later heads are less often reached.
The Trainer subclass overrides `compute_loss` only; the model it optimises wraps target + heads.

It does not decode with the heads (the Engine's `medusa` mode does) or register them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import Trainer, TrainingArguments

from draftwheel.config import to_dict
from draftwheel.serving.engine.acceptance import mean_accepted_length
from draftwheel.serving.engine.medusa import MedusaHeads
from draftwheel.serving.engine.sampling import greedy
from draftwheel.tracking import get_tracker
from draftwheel.training import common, losses
from draftwheel.training.data import DistillCollator, HoldoutExample, load_dataset_dir, load_holdout, tokenize_distill
from draftwheel.training.evaluate import TrackerCallback


@dataclass
class MedusaConfig(common.TrainCommon):
    """Medusa head settings; see configs/medusa.yaml."""

    target: str = ""             # target model dir / models:/ URI; "" = the reference target in the state dir
    dataset: str = ""            # distill/ dataset dir (target outputs); "" = <state>/datasets/distill
    holdout: str = ""            # holdout/ dataset for per-head accuracy; "" = sibling of dataset, if any
    n_heads: int = 3             # heads; head i predicts token t + i + 2
    n_layers: int = 1            # residual blocks per head
    loss: str = "kl"             # kl: match the target's distribution | ce: its emitted token
    head_decay: float = 0.8      # weight of head i's loss is head_decay ** i
    learning_rate: float = 1e-3
    epochs: float = 2.0
    max_length: int = 256
    eval_max_samples: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        common.require(self.n_heads >= 1, "n_heads", f"must be >= 1, got {self.n_heads}")
        common.require(self.n_layers >= 1, "n_layers", f"must be >= 1, got {self.n_layers}")
        common.require(self.loss in ("kl", "ce"), "loss", f"must be 'kl' or 'ce', got {self.loss!r}")
        common.require(0 < self.head_decay <= 1, "head_decay", f"must be in (0, 1], got {self.head_decay}")


class MedusaModel(nn.Module):
    """Frozen target + trainable heads; the module the Trainer optimises (only the heads have grads)."""

    def __init__(self, target: nn.Module, heads: MedusaHeads):
        super().__init__()
        self.target = target.requires_grad_(False).eval()
        self.heads = heads

    def target_forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(final hidden states [B, T, H], logits [B, T, V]) of the frozen target."""
        with torch.no_grad():
            out = self.target(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
        return out.hidden_states[-1], out.logits


def head_masks(loss_mask: torch.Tensor, n_heads: int) -> list[torch.Tensor]:
    """For head i, positions t whose target token t + i + 2 is a completion token.

    `loss_mask[t]` marks that token t + 1 is a completion token, so head i uses `loss_mask[t + i + 1]`;
    the last i + 1 positions have no such token.
    """
    width = loss_mask.shape[1]
    masks = []
    for i in range(n_heads):
        shifted = torch.zeros_like(loss_mask)
        if width > i + 1:
            shifted[:, : width - i - 1] = loss_mask[:, i + 1:]
        masks.append(shifted)
    return masks


def head_losses(model: MedusaModel, inputs: dict[str, torch.Tensor], loss: str) -> list[torch.Tensor]:
    """One scalar loss per head (0 when a head has no position in this batch)."""
    hidden, logits = model.target_forward(inputs["input_ids"], inputs["attention_mask"])
    results = []
    for i, mask in enumerate(head_masks(inputs["loss_mask"], model.heads.n_heads)):
        if not mask.any():
            results.append(hidden.sum() * 0.0)
            continue
        student = model.heads.head_logits(i, hidden[mask])
        if loss == "ce":
            labels = torch.roll(inputs["input_ids"], shifts=-(i + 2), dims=1)[mask]
            results.append(F.cross_entropy(student.float(), labels))
        else:
            teacher = torch.roll(logits, shifts=-(i + 1), dims=1)[mask]
            results.append(losses.forward_kl(student, teacher))
    return results


class MedusaTrainer(Trainer):
    """A Trainer whose loss is the decayed sum of the heads' losses."""

    def __init__(self, *args: Any, loss_name: str = "kl", head_decay: float = 0.8, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.loss_name, self.head_decay = loss_name, head_decay

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        per_head = head_losses(self.accelerator.unwrap_model(model), inputs, self.loss_name)
        loss = sum(self.head_decay ** i * value for i, value in enumerate(per_head))
        return (loss, {"head_losses": torch.stack(per_head).detach()}) if return_outputs else loss


def head_accuracy(model: MedusaModel, examples: list[HoldoutExample]) -> dict[str, float]:
    """Per-head top-1 agreement with the target's greedy tokens on hold-out outputs, and the implied
    chain length `1 + E[leading heads that agree]` (tokens per target step of a top-1 Medusa chain)."""
    hits = [0] * model.heads.n_heads
    counts = [0] * model.heads.n_heads
    runs: list[int] = []
    for example in examples:
        ids = torch.tensor([example.prompt_ids + example.output_ids])
        hidden, logits = model.target_forward(ids, torch.ones_like(ids))
        target_ids = greedy(logits)[0]  # target_ids[t] = target's token for position t + 1
        with torch.no_grad():
            preds = greedy(model.heads(hidden))[:, 0]  # [n_heads, T]
        start = len(example.prompt_ids) - 1
        for t in range(start, ids.shape[1]):
            run, leading = 0, True
            for i in range(model.heads.n_heads):
                if t + i + 1 >= ids.shape[1]:
                    break
                match = bool(preds[i, t] == target_ids[t + i + 1])
                hits[i] += match
                counts[i] += 1
                leading = leading and match
                run += leading
            runs.append(run)
    metrics = {f"head{i}_accuracy": hits[i] / counts[i] if counts[i] else 0.0 for i in range(len(hits))}
    metrics["chain_mean_accepted_length"] = mean_accepted_length(sum(runs), len(runs))
    return metrics


def _paths(config: MedusaConfig) -> tuple[Path, Path | None]:
    dataset = common.resolve_dataset(config.dataset, "distill")
    holdout = Path(config.holdout) if config.holdout else dataset.parent / "holdout"
    return dataset, (holdout if holdout.is_dir() else None)


def train_medusa(config: MedusaConfig, tracker: Any = None) -> Path:
    """Train Medusa heads on the frozen target; return the saved heads dir."""
    from draftwheel.serving.loading import load_model, resolve_target

    tracker = tracker or get_tracker(config.tracking)
    dataset_dir, holdout_dir = _paths(config)
    out_dir = common.resolve_output_dir(config.output_dir, "medusa")
    target = load_model(resolve_target(config.target))
    heads = MedusaHeads.for_target(target.model, config.n_heads, config.n_layers, target.model_id.sha256)
    model = MedusaModel(target.model, heads)
    pad_id = target.tokenizer.pad_token_id if target.tokenizer.pad_token_id is not None else 0
    train_set = tokenize_distill(load_dataset_dir(dataset_dir, ("prompt_token_ids", "completion_token_ids")),
                                 config.max_length, use_weights=False)
    holdout = load_holdout(holdout_dir, config.eval_max_samples, config.max_length) if holdout_dir else []
    args = TrainingArguments(**common.training_arguments_kwargs(config, out_dir))
    trainer = MedusaTrainer(model=model, args=args, train_dataset=train_set, data_collator=DistillCollator(pad_id),
                            callbacks=[TrackerCallback(tracker)], loss_name=config.loss, head_decay=config.head_decay)
    with tracker.run("train-medusa", nested=True, tags={"stage": "medusa"}):
        tracker.log_params({**to_dict(config), **common.count_parameters(heads.blocks)})
        before = head_accuracy(model, holdout) if holdout else {}
        started = time.perf_counter()
        result = trainer.train()
        runtime = common.seconds_since(started)
        tokens = sum(len(ids) for ids in train_set["input_ids"]) * trainer.state.epoch
        metrics = {"train_loss": result.training_loss, "train_runtime_s": runtime, "train_tokens": tokens,
                   "train_tokens_per_s": tokens / max(runtime, 1e-9), "steps": trainer.state.global_step}
        model.eval()
        metrics.update({f"before_{k}": v for k, v in before.items()})
        metrics.update({f"eval_{k}": v for k, v in (head_accuracy(model, holdout) if holdout else {}).items()})
        common.log_summary(tracker, metrics, trainer.state.global_step)
        if trainer.is_world_process_zero():
            heads.save(out_dir)
            common.write_training_info(out_dir, "medusa", config, metrics,
                                       {"target": str(target.path), "target_sha256": target.model_id.sha256})
            tracker.log_artifact(out_dir)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Entry point for `python -m draftwheel.training.medusa_train` / `accelerate launch -m draftwheel.training.medusa_train`."""
    return common.module_main(train_medusa, MedusaConfig, "Train Medusa heads on the frozen target.",
                              "configs/medusa.yaml", argv)


if __name__ == "__main__":
    raise SystemExit(main())
