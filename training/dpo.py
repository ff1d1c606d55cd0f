"""Preference tuning of the draft on mined accept/reject pairs (`draftwheel train dpo`).

Each `preference/` row is one verification step where the target rejected a draft token: the prompt
is the request prompt plus the accepted prefix, `chosen` is the target's token and `rejected` the draft's
(reward = acceptance by the target). TRL's `DPOTrainer` does the optimisation; our subclass overrides
only `_prepare_dataset`, to feed the exact token ids that serving recorded instead of re-tokenizing the
text (re-tokenizing a prefix and a one-token continuation separately can merge across the boundary, and
TRL would also append EOS to every one-token completion, teaching the draft to stop). The start model is
the current champion (a model dir or `models:/` URI); the reference model is a frozen copy of that same
start (TRL's default when no `ref_model` is passed). LoRA adapters, when used, are merged before saving.

It does not mine pairs or register the result.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trl import DPOConfig, DPOTrainer

from draftwheel.config import to_dict
from draftwheel.registry_names import CHAMPION_URI
from draftwheel.tracking import get_tracker
from draftwheel.training import common
from draftwheel.training.data import load_dataset_dir, load_holdout
from draftwheel.training.evaluate import AgreementCallback, TrackerCallback, target_references

PREFERENCE_COLUMNS = ("prompt_token_ids", "chosen_token_ids", "rejected_token_ids")


@dataclass
class DpoConfig(common.TrainCommon, common.LoraFields):
    """DPO settings; see configs/dpo.yaml."""

    student: str = CHAMPION_URI  # start (and reference) model: dir or models:/ URI
    target: str = ""             # optional: hold-out references (target argmax) and the target_sha256 tag
    dataset: str = ""            # preference/ dataset dir; "" = <state>/datasets/preference
    holdout: str = ""            # holdout/ dataset for agreement before/after; "" = sibling of dataset, if any
    beta: float = 0.1            # DPO inverse temperature (strength of the KL tie to the reference)
    loss_type: str = "sigmoid"   # TRL DPO loss: sigmoid | hinge | ipo | robust ...
    freeze_embeddings: bool = True  # keep the (target-shared) embeddings and LM head frozen
    learning_rate: float = 5e-5
    lora: bool = True
    batch_size: int = 8
    max_length: int = 256

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_lora()
        common.require(self.beta > 0, "beta", f"must be > 0, got {self.beta}")
        common.require(bool(self.loss_type), "loss_type", "must not be empty")
        common.require(bool(self.student), "student", "must name a model dir or models:/ URI")


class TokenIdDPOTrainer(DPOTrainer):
    """DPOTrainer fed with pre-tokenized pairs (`prompt_token_ids`, `chosen_token_ids`, `rejected_token_ids`)."""

    def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
        if not set(PREFERENCE_COLUMNS) <= set(dataset.column_names):
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
        limit = args.max_length or 10**9

        def to_ids(row: dict[str, Any]) -> dict[str, Any]:
            completion = max(len(row["chosen_token_ids"]), len(row["rejected_token_ids"]))
            # Keep the end of the prompt: it is what the chosen/rejected token depends on most.
            keep = max(limit - completion, 1)
            return {"prompt_ids": row["prompt_token_ids"][-keep:], "chosen_ids": row["chosen_token_ids"],
                    "rejected_ids": row["rejected_token_ids"]}

        return dataset.map(to_ids, remove_columns=dataset.column_names, desc=f"{dataset_name}: token ids")


def _paths(config: DpoConfig) -> tuple[Path, Path | None]:
    dataset = common.resolve_dataset(config.dataset, "preference")
    holdout = Path(config.holdout) if config.holdout else dataset.parent / "holdout"
    return dataset, (holdout if holdout.is_dir() else None)


def _peft_config(config: DpoConfig) -> Any:
    if not config.lora:
        return None
    from peft import LoraConfig

    return LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")


def train_dpo(config: DpoConfig, tracker: Any = None) -> Path:
    """DPO-tune the start model on the preference pairs; return the saved (merged) candidate dir."""
    from draftwheel.serving.loading import load_model

    tracker = tracker or get_tracker(config.tracking)
    dataset_dir, holdout_dir = _paths(config)
    out_dir = common.resolve_output_dir(config.output_dir, "dpo")
    start = load_model(config.student)
    model = start.model.train()
    if config.freeze_embeddings:
        common.freeze_shared_embeddings(model)
    pairs = load_dataset_dir(dataset_dir, PREFERENCE_COLUMNS)
    callbacks: list[Any] = [TrackerCallback(tracker)]
    holdout = load_holdout(holdout_dir, config.eval_max_samples, config.max_length) if holdout_dir else None
    target = load_model(config.target) if config.target else None
    if holdout:
        refs = target_references(target.model, holdout) if target else None
        callbacks.append(AgreementCallback(holdout, tracker, config.eval_k, refs))
    args = DPOConfig(**common.training_arguments_kwargs(config, out_dir),
                     beta=config.beta, loss_type=[config.loss_type], max_length=config.max_length,
                     precompute_ref_log_probs=False,
                     # TRL turns recomputation on by default; a small draft has no memory to save.
                     activation_checkpointing=False)
    trainer = TokenIdDPOTrainer(model=model, args=args, train_dataset=pairs, processing_class=start.tokenizer,
                                callbacks=callbacks, peft_config=_peft_config(config))
    with tracker.run("train-dpo", nested=True, tags={"stage": "dpo"}):
        tracker.log_params({**to_dict(config), **common.count_parameters(trainer.model)})
        result = trainer.train()
        metrics = {"train_loss": result.training_loss, "train_runtime_s": result.metrics["train_runtime"],
                   "pairs": len(pairs), "steps": trainer.state.global_step}
        eval_history = callbacks[-1].history if holdout else []  # the AgreementCallback, appended last
        target_sha = target.model_id.sha256 if target else common.read_training_info(start.path).get("target_sha256")
        common.finish_training(trainer, tracker, metrics, eval_history, start.tokenizer, out_dir, "dpo", config,
                               {"student": config.student, "dataset": str(dataset_dir), "target_sha256": target_sha})
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Entry point for `python -m draftwheel.training.dpo` / `accelerate launch -m draftwheel.training.dpo`."""
    return common.module_main(train_dpo, DpoConfig, "DPO-tune the draft on accept/reject pairs.",
                              "configs/dpo.yaml", argv)


if __name__ == "__main__":
    raise SystemExit(main())
