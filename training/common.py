"""Pieces shared by the three trainers: the common config fields, Trainer arguments, LoRA, saving.

Each stage's config dataclass (`DistillConfig`, `DpoConfig`, `MedusaConfig`) extends `TrainCommon`, so
schedule/optimiser/tracking fields are spelled and validated once. Candidate dirs are written here:
weights (safetensors) + tokenizer + `draftwheel_training.json` (stage, config, metrics, target hash).
Nothing here decides *what* to train.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftwheel import home
from draftwheel.config import to_dict

INFO_FILE = "draftwheel_training.json"
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def require(condition: bool, name: str, message: str) -> None:
    if not condition:
        raise ValueError(f"{name}: {message}")


@dataclass
class TrainCommon:
    """Fields every trainer shares. Paths left empty resolve under the state dir at run time."""

    output_dir: str = ""         # candidate dir; "" = <state>/models/candidates/<stage>-<utc time>
    learning_rate: float = 1e-4  # peak learning rate (cosine decay after warmup)
    epochs: float = 1.0          # passes over the dataset (ignored when max_steps > 0)
    max_steps: int = -1          # optimiser steps; -1 = derived from epochs
    batch_size: int = 4          # sequences per device per step
    grad_accum: int = 1          # gradient accumulation steps
    warmup_steps: int = 0        # linear warmup steps
    weight_decay: float = 0.0    # AdamW weight decay
    max_length: int = 512        # tokens per training sequence (prompt cut from the left first)
    seed: int = 0                # data order and init seed
    logging_steps: int = 10      # log the training loss every N steps
    device: str = "cpu"          # "cpu", or "auto" to let the Trainer/accelerate pick the accelerator
    tracking: bool = True        # log to MLflow (False: the do-nothing tracker)
    eval_k: int = 4              # draft length k used by the agreement evaluation
    eval_max_samples: int = 64   # hold-out sequences evaluated each epoch (0 = all)

    def __post_init__(self) -> None:
        require(self.learning_rate > 0, "learning_rate", f"must be > 0, got {self.learning_rate}")
        require(self.epochs > 0, "epochs", f"must be > 0, got {self.epochs}")
        require(self.max_steps == -1 or self.max_steps > 0, "max_steps", f"must be -1 or > 0, got {self.max_steps}")
        for name in ("batch_size", "grad_accum", "max_length", "logging_steps", "eval_k"):
            require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "eval_max_samples"):
            require(getattr(self, name) >= 0, name, f"must be >= 0, got {getattr(self, name)}")
        require(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")
        require(self.device in ("cpu", "auto"), "device", f"must be 'cpu' or 'auto', got {self.device!r}")


@dataclass
class LoraFields:
    """LoRA options (peft); the adapter is merged into the weights before saving."""

    lora: bool = False           # train LoRA adapters instead of all (unfrozen) weights
    lora_r: int = 16             # adapter rank
    lora_alpha: int = 32         # adapter scaling numerator
    lora_dropout: float = 0.0    # adapter dropout
    lora_target_modules: list[str] = field(default_factory=lambda: list(LORA_TARGETS))

    def check_lora(self) -> None:
        require(self.lora_r >= 1, "lora_r", f"must be >= 1, got {self.lora_r}")
        require(self.lora_alpha >= 1, "lora_alpha", f"must be >= 1, got {self.lora_alpha}")
        require(0 <= self.lora_dropout < 1, "lora_dropout", f"must be in [0, 1), got {self.lora_dropout}")
        require(bool(self.lora_target_modules), "lora_target_modules", "must not be empty")


@dataclass
class EpochSelectionFields:
    """Which epoch's weights a trainer saves: the best for the shadow gate (draftwheel.training.evaluate.EpochSelection)."""

    keep_best_epoch: bool = True  # save the epoch best for the shadow gate (hold-out, per slice), not the last
    early_stop_patience: int = 2  # stop after this many epochs without a better one (0 = run every epoch)
    forgetting_tolerance: float = 0.05  # an epoch whose slice dropped more than this (vs the start) is not eligible
    eval_min_slice_examples: int = 10   # smaller hold-out slices are judged pooled (draftwheel.evaluation.gate.slice_groups)
    weight_mixes: list[float] = field(default_factory=list)  # also judge start + m * (kept - start) for these m (WiSE-FT)
    mix_keep: float = 0.75  # where the kept weights lost a slice group: a mix holding this share of their gain

    def check_selection(self) -> None:
        require(self.early_stop_patience >= 0, "early_stop_patience", f"must be >= 0, got {self.early_stop_patience}")
        require(0.0 <= self.forgetting_tolerance < 1.0, "forgetting_tolerance",
                f"must be a fraction in [0, 1), got {self.forgetting_tolerance}")
        require(self.eval_min_slice_examples >= 1, "eval_min_slice_examples",
                f"must be >= 1, got {self.eval_min_slice_examples}")
        require(all(isinstance(m, (int, float)) and 0.0 < m < 1.0 for m in self.weight_mixes), "weight_mixes",
                f"must be fractions in (0, 1), got {self.weight_mixes}")
        require(0.0 < self.mix_keep <= 1.0, "mix_keep", f"must be a fraction in (0, 1], got {self.mix_keep}")

    def epoch_selection(self) -> Any:
        from draftwheel.training.evaluate import EpochSelection

        return EpochSelection(tolerance=self.forgetting_tolerance, min_slice_examples=self.eval_min_slice_examples,
                              patience=self.early_stop_patience, keep_best=self.keep_best_epoch,
                              mixes=tuple(float(m) for m in self.weight_mixes), mix_keep=self.mix_keep)


def resolve_dataset(path: str, kind: str) -> Path:
    """A trainer's dataset dir: `path`, or where `draftwheel mine` writes `kind` by default."""
    return Path(path) if path else home.mined_dataset(kind)


def resolve_output_dir(output_dir: str, stage: str) -> Path:
    if output_dir:
        return Path(output_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    return home.models_dir() / "candidates" / f"{stage}-{stamp}"


def training_arguments_kwargs(config: TrainCommon, out_dir: Path) -> dict[str, Any]:
    """Keyword arguments for `transformers.TrainingArguments` (or a TRL config subclassing it). The Trainer
    writes nothing into `out_dir` itself (`save_strategy="no"`, no report_to); we save the candidate there."""
    return dict(
        output_dir=str(out_dir), per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.grad_accum, learning_rate=config.learning_rate,
        num_train_epochs=config.epochs, max_steps=config.max_steps, warmup_steps=config.warmup_steps,
        weight_decay=config.weight_decay, lr_scheduler_type="cosine", logging_steps=config.logging_steps,
        save_strategy="no", report_to=[], seed=config.seed, data_seed=config.seed,
        use_cpu=config.device == "cpu", dataloader_num_workers=0, remove_unused_columns=False,
        disable_tqdm=False, ddp_timeout=DATA_PREPARATION_TIMEOUT_S,
    )


# Under several processes the other ranks wait for the main one to prepare the data (target features,
# continuations, the teacher cache: `main_process_first`), longer than torch.distributed's 30 minutes on
# a large round.
DATA_PREPARATION_TIMEOUT_S = 4 * 3600


def is_main_process(args: Any) -> bool:
    """Rank 0 of a data-parallel run (`accelerate launch`, torchrun): the one process that logs to MLflow
    and writes the candidate. True in-process."""
    return args.process_index == 0


def process_tracker(tracker: Any, enabled: bool, args: Any) -> Any:
    """What this process logs to: `tracker` (default MLflow when `enabled`) on the main process, the
    do-nothing tracker on the other ranks, so N processes make one MLflow run, not N."""
    from draftwheel.tracking import get_tracker

    if not is_main_process(args):
        return get_tracker(False)
    return tracker or get_tracker(enabled)


def freeze_shared_embeddings(model: Any) -> None:
    """Freeze input embeddings and LM head (tied or not): the draft shares them with the target."""
    for module in (model.get_input_embeddings(), model.get_output_embeddings()):
        for param in module.parameters():
            param.requires_grad_(False)


def apply_lora(model: Any, config: LoraFields) -> Any:
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def merged(model: Any) -> Any:
    """A plain model: LoRA adapters merged into the base weights (no-op for a full fine-tune)."""
    return model.merge_and_unload() if hasattr(model, "merge_and_unload") else model


def count_parameters(model: Any) -> dict[str, int]:
    params = list(model.parameters())
    return {"params_total": sum(p.numel() for p in params),
            "params_trainable": sum(p.numel() for p in params if p.requires_grad)}


def save_candidate(model: Any, tokenizer: Any, out_dir: Path, stage: str, config: Any,
                   metrics: dict[str, Any], extra: dict[str, Any] | None = None) -> Path:
    """Write a servable model dir: safetensors weights, tokenizer, and the training info json."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    return write_training_info(out_dir, stage, config, metrics, extra)


def finish_training(trainer: Any, tracker: Any, metrics: dict[str, Any], eval_history: list[dict[str, Any]],
                    tokenizer: Any, out_dir: Path, stage: str, config: Any, extra: dict[str, Any]) -> None:
    """Log the final metrics (with the last hold-out evaluation) and, on the main process only, save the
    merged candidate with its training info and attach that info to the run."""
    if eval_history:
        metrics.update({f"eval_{k}": v for k, v in eval_history[-1].items()})
    log_summary(tracker, metrics, trainer.state.global_step)
    if trainer.is_world_process_zero():
        save_candidate(merged(trainer.model), tokenizer, out_dir, stage, config, metrics,
                       {**extra, "eval_history": eval_history})
        tracker.log_artifact(out_dir / INFO_FILE)


def log_summary(tracker: Any, metrics: dict[str, Any], step: int) -> None:
    """Log a training run's closing figures at its last (global) step, beside the histories MLflow charts
    by step: the Trainer's `train_*` every `logging_steps` (`TrackerCallback`) and the held-out `eval_*`
    before training and after every epoch (`EpochSelectionCallback`). A figure those histories already
    hold is not logged again: the last evaluation (`eval_*`), and the mean training loss goes in as
    `train_loss_mean`, since the chart's `train_loss` is the loss of each logging window."""
    summary = {("train_loss_mean" if k == "train_loss" else k): float(v) for k, v in metrics.items()
               if not k.startswith("eval_")}
    tracker.log_metrics(summary, step=step)


def write_training_info(out_dir: Path, stage: str, config: Any, metrics: dict[str, Any],
                        extra: dict[str, Any] | None = None) -> Path:
    """`draftwheel_training.json`: what produced this dir (stage, config, metrics, provenance)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    # The state dir it was written in, so paths under it can follow the state dir when it is moved or
    # copied (recorded_path).
    info = {"stage": stage, "config": to_dict(config), "metrics": metrics, "state_dir": str(home.state_dir()),
            **(extra or {})}
    (out_dir / INFO_FILE).write_text(json.dumps(info, indent=2, default=str))
    return out_dir


def read_training_info(model_dir: str | Path) -> dict[str, Any]:
    path = Path(model_dir) / INFO_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def recorded_path(info: dict[str, Any], path: str | Path) -> Path:
    """A path a training info recorded, read in the current state dir: one under the state dir the info
    was written in is re-rooted under the current one, so a moved state dir still finds its data and a
    copied one reads its own, not the original's. Other paths (and infos written before the state dir was
    recorded) come back as they are."""
    path = Path(path)
    written_in = info.get("state_dir")
    if written_in and path.is_relative_to(written_in):
        return home.state_dir() / path.relative_to(written_in)
    return path


def seconds_since(start: float) -> float:
    return time.perf_counter() - start


def module_main(train: Any, config_cls: type, description: str, config_file: str,
                argv: list[str] | None = None) -> int:
    """The `python -m training.X` / `accelerate launch -m training.X` entry point shared by the trainers:
    `--config F` plus `key=value` overrides, offline defaults, prints the output dir (rank 0 only)."""
    import argparse

    from draftwheel.config import add_override_arguments, load_config

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", default=None, help=f"YAML config ({config_file})")
    add_override_arguments(parser)
    args = parser.parse_args(argv)
    home.apply_offline_defaults()
    out_dir = train(load_config(config_cls, args.config, args.overrides))
    if os.environ.get("RANK", "0") == "0":  # under a launcher only rank 0 wrote it
        print(out_dir)
    return 0
