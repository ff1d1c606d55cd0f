"""Knowledge distillation of a draft model from the frozen target (`draftwheel train distill`).

`train_distill(config)` loads the student (current champion, or any model dir) and the target, and
trains the student with a `transformers.Trainer` whose only change is `compute_loss`: a divergence from
`draftwheel.training.losses` between target and student next-token distributions on completion tokens,
weighted per sequence (`prompt_loss` adds prompt tokens; `on_policy_fraction` lets the student write
some completions itself, GKD-style). Teacher logits come either from a forward pass of the frozen target each step
(`teacher_mode: online`) or from a top-k log-prob cache on disk built once (`teacher_mode: cached`).
Full fine-tune or LoRA (merged before saving). Runs in-process or as
`accelerate launch -m draftwheel.training.distill --config F` (the Trainer handles the accelerate state).

It does not mine data, register models or decide promotion.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainingArguments

from draftwheel.config import to_dict
from draftwheel.registry_names import CHAMPION_URI
from draftwheel.training import common, losses
from draftwheel.training.data import (DistillCollator, build_teacher_cache, cache_key, has_teacher_topk, load_dataset_dir,
                           load_holdout, loss_mask_for, tokenize_distill)
from draftwheel.training.evaluate import AgreementCallback, TrackerCallback, target_references

DISTILL_COLUMNS = ("prompt_token_ids", "completion_token_ids")


@dataclass
class DistillConfig(common.TrainCommon, common.LoraFields, common.EpochSelectionFields):
    """Distillation settings; see configs/distill.yaml for the defaults with comments."""

    student: str = CHAMPION_URI  # starting draft: model dir or models:/ URI
    target: str = ""             # target model dir / models:/ URI; "" = the reference target in the state dir
    dataset: str = ""            # distill/ dataset dir; "" = <state>/datasets/distill
    holdout: str = ""            # holdout/ dataset dir for per-epoch agreement; "" = sibling of dataset, if any
    loss: str = "fkl"            # fkl | rkl | jsd | tvd
    beta: float = 0.5            # jsd interpolation (TRL convention: 0 = forward KL, 1 = reverse KL)
    temperature: float = 1.0     # softmax temperature applied to both distributions
    teacher_mode: str = "cached"  # cached: top-k log-probs (stored with the data or on disk) | online: target forward each step
    top_k: int = 64              # cached mode: teacher log-probs kept per position
    freeze_embeddings: bool = True  # keep the (target-shared) embeddings and LM head frozen
    use_weights: bool = True     # weight each sequence's loss by the dataset's `weight` column
    prompt_loss: bool = False    # also learn the target's distribution on prompt tokens (not only completions)
    on_policy_fraction: float = 0.0  # share of batches whose completions the student samples itself (GKD's lmbda)
    learning_rate: float = 1e-3
    epochs: float = 3.0
    max_length: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_lora()
        common.require(self.loss in losses.LOSSES, "loss", f"must be one of {sorted(losses.LOSSES)}, got {self.loss!r}")
        common.require(0.0 <= self.beta <= 1.0, "beta", f"must be in [0, 1], got {self.beta}")
        common.require(self.temperature > 0, "temperature", f"must be > 0, got {self.temperature}")
        common.require(self.teacher_mode in ("online", "cached"), "teacher_mode",
                        f"must be 'online' or 'cached', got {self.teacher_mode!r}")
        common.require(self.top_k >= 1, "top_k", f"must be >= 1, got {self.top_k}")
        common.require(bool(self.student), "student", "must name a model dir or models:/ URI")
        self.check_selection()
        common.require(0.0 <= self.on_policy_fraction <= 1.0, "on_policy_fraction",
                       f"must be in [0, 1], got {self.on_policy_fraction}")
        if self.on_policy_fraction > 0:  # student-written text has no stored or cached teacher
            common.require(self.teacher_mode == "online" and not self.prompt_loss, "on_policy_fraction",
                           "needs teacher_mode: online and prompt_loss: false")


def _completion_logits(model: Any, head: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor:
    """LM-head logits at the masked positions only: [N, V]. Skipping the head on prompt positions saves
    most of a small draft's compute, whose cost is dominated by the vocabulary projection."""
    outputs = model(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True, logits_to_keep=1)
    return head(outputs.hidden_states[-1][mask])


def on_policy_batch(model: Any, inputs: dict[str, torch.Tensor], pad_id: int) -> dict[str, torch.Tensor]:
    """The batch with each row's completion replaced by the student's own sampled continuation of its
    prompt (at most as long as the original), as in GKD / DistillSpec's on-policy data."""
    rows, budgets = [], []
    for mask, attention, ids in zip(inputs["loss_mask"], inputs["attention_mask"], inputs["input_ids"]):
        prompt_len = int(mask.nonzero()[0]) + 1  # the first counted logits position predicts token prompt_len
        rows.append(ids[:prompt_len].tolist())
        budgets.append(int(mask.sum()))
    width = max(len(r) for r in rows)
    device = inputs["input_ids"].device
    padded = torch.tensor([[pad_id] * (width - len(r)) + r for r in rows], device=device)
    attention = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    with torch.no_grad():
        generated = model.generate(input_ids=padded, attention_mask=attention, do_sample=True,
                                   max_new_tokens=max(budgets), pad_token_id=pad_id)[:, width:]
    eos = model.generation_config.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])
    examples = []
    for i, prompt in enumerate(rows):
        completion = generated[i, :budgets[i]].tolist()
        ends = [j for j, token in enumerate(completion) if token in eos_ids]
        completion = completion[: ends[0] + 1] if ends else completion  # what follows EOS is padding
        examples.append({"input_ids": prompt + completion, "weight": float(inputs["weight"][i]),
                         "loss_mask": loss_mask_for(len(prompt) + len(completion), len(prompt))})
    return {k: v.to(device) for k, v in DistillCollator(pad_id)(examples).items()}


class DistillTrainer(Trainer):
    """A Trainer whose loss is a divergence from the frozen teacher on completion tokens."""

    def __init__(self, *args: Any, teacher: Any = None, loss_name: str = "fkl", beta: float = 0.5,
                 temperature: float = 1.0, on_policy_fraction: float = 0.0, pad_id: int = 0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.teacher, self.loss_name, self.beta, self.temperature = teacher, loss_name, beta, temperature
        self.on_policy_fraction, self.pad_id = on_policy_fraction, pad_id
        self._rng = random.Random(self.args.seed)

    def _teacher_logits(self, inputs: dict[str, torch.Tensor], mask: torch.Tensor, vocab: int) -> torch.Tensor:
        if "teacher_topk_values" in inputs:
            return losses.dense_logits_from_topk(inputs["teacher_topk_values"][mask],
                                                 inputs["teacher_topk_indices"][mask], vocab)
        self.teacher.to(inputs["input_ids"].device)
        with torch.no_grad():
            return _completion_logits(self.teacher, self.teacher.get_output_embeddings(), inputs["input_ids"],
                                      inputs["attention_mask"], mask)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        unwrapped = self.accelerator.unwrap_model(model)
        if self.on_policy_fraction and self._rng.random() < self.on_policy_fraction:
            inputs = on_policy_batch(unwrapped, inputs, self.pad_id)
        mask = inputs["loss_mask"]
        head = unwrapped.get_output_embeddings()
        student = _completion_logits(model, head, inputs["input_ids"], inputs["attention_mask"], mask)
        teacher = self._teacher_logits(inputs, mask, student.shape[-1])
        per_token = losses.divergence(self.loss_name, student, teacher, temperature=self.temperature,
                                      beta=self.beta, reduction="none")
        weights = inputs["weight"].unsqueeze(1).expand_as(mask)[mask]
        loss = (per_token * weights).sum() / weights.sum().clamp_min(1e-8)
        return (loss, {"logits": student}) if return_outputs else loss


def _resolve_paths(config: DistillConfig) -> tuple[Path, Path | None]:
    dataset = common.resolve_dataset(config.dataset, "distill")
    if config.holdout:
        return dataset, Path(config.holdout)
    sibling = dataset.parent / "holdout"
    return dataset, (sibling if sibling.is_dir() else None)


def _prepare_student(config: DistillConfig, loaded: Any) -> Any:
    model = loaded.model
    model.train()
    if config.freeze_embeddings:
        common.freeze_shared_embeddings(model)
    if config.lora:
        model = common.apply_lora(model, config)
    return model


def _train_dataset(config: DistillConfig, dataset_dir: Path, teacher: Any, teacher_sha: str, pad_id: int) -> Any:
    """Tokenized rows; in cached mode with the teacher's top-k, from the dataset itself or a disk cache."""
    dataset = load_dataset_dir(dataset_dir, DISTILL_COLUMNS)
    # Top-k stored with the data covers completion positions only, so prompt_loss needs a full teacher.
    stored = config.teacher_mode == "cached" and has_teacher_topk(dataset) and not config.prompt_loss
    encoded = tokenize_distill(dataset, config.max_length, config.use_weights, with_teacher=stored,
                               prompt_loss=config.prompt_loss)
    if config.teacher_mode == "online" or stored:
        return encoded
    cache_dir = dataset_dir.parent / "teacher_cache" / cache_key(encoded, teacher_sha, config.top_k, config.max_length)
    return build_teacher_cache(teacher, encoded, config.top_k, cache_dir, config.batch_size, pad_id)


def train_distill(config: DistillConfig, tracker: Any = None) -> Path:
    """Distil the student towards the target; return the saved candidate dir. Under several processes
    (`accelerate launch`) each trains on its shard with gradients all-reduced (the Trainer's DDP), and rank 0
    alone judges the epochs, logs to MLflow and writes the candidate."""
    from draftwheel.serving.loading import load_model, resolve_target

    dataset_dir, holdout_dir = _resolve_paths(config)
    out_dir = common.resolve_output_dir(config.output_dir, "distill")
    args = TrainingArguments(**common.training_arguments_kwargs(config, out_dir))
    tracker = common.process_tracker(tracker, config.tracking, args)
    # Under several processes the main one fetches the models (a registry URI downloads, the reference target
    # converts once) and builds the teacher cache; the others then read what it wrote.
    with args.main_process_first(local=False, desc="the models and the teacher cache"):
        target = load_model(resolve_target(config.target, config.student))
        student = load_model(config.student)
        target.model.requires_grad_(False)
        pad_id = student.tokenizer.pad_token_id if student.tokenizer.pad_token_id is not None else 0
        started = time.perf_counter()
        train_set = _train_dataset(config, dataset_dir, target.model, target.model_id.sha256, pad_id)
        cache_s = common.seconds_since(started)
    model = _prepare_student(config, student)
    callbacks: list[Any] = [TrackerCallback(tracker)]
    holdout = load_holdout(holdout_dir, config.eval_max_samples, config.max_length) if holdout_dir else None
    if holdout:  # only the main process evaluates the epochs
        refs = target_references(target.model, holdout) if common.is_main_process(args) else None
        callbacks.append(AgreementCallback(holdout, tracker, config.eval_k, refs, selection=config.epoch_selection()))
    trainer = DistillTrainer(
        model=model, args=args, train_dataset=train_set, data_collator=DistillCollator(pad_id),
        callbacks=callbacks, teacher=None if config.teacher_mode == "cached" else target.model,
        loss_name=config.loss, beta=config.beta, temperature=config.temperature,
        on_policy_fraction=config.on_policy_fraction, pad_id=pad_id,
    )
    with tracker.run("train-distill", nested=True, tags={"stage": "distill"}):
        tracker.log_params({**to_dict(config), **common.count_parameters(model)})
        result = trainer.train()
        tokens = sum(len(ids) for ids in train_set["input_ids"]) * trainer.state.epoch
        metrics = {"train_loss": result.training_loss, "train_runtime_s": result.metrics["train_runtime"],
                   "train_tokens": tokens, "train_tokens_per_s": tokens / max(result.metrics["train_runtime"], 1e-9),
                   "teacher_cache_s": cache_s, "steps": trainer.state.global_step}
        evaluation = callbacks[-1] if holdout else None  # the AgreementCallback, appended last
        common.finish_training(trainer, tracker, metrics, evaluation.history if evaluation else [], student.tokenizer,
                               out_dir, "distill", config,
                               {"target": str(target.path), "target_sha256": target.model_id.sha256,
                                "student": config.student, "dataset": str(dataset_dir),
                                "epoch_selection": evaluation.summary() if evaluation else None})
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Entry point for `python -m draftwheel.training.distill` / `accelerate launch -m draftwheel.training.distill`."""
    return common.module_main(train_distill, DistillConfig, "Distil a draft model from the target.",
                              "configs/distill.yaml", argv)


if __name__ == "__main__":
    raise SystemExit(main())
