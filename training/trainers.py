"""The table of built-in trainers, in one place: `draftwheel train`, the flows and the trainers' module
mains all read it. A new trainer is one more `Trainer(...)` row here (plus its module and configs/NAME.yaml).

Each row names the module, its config class and train function (imported only when used, so reading the
table is cheap), the mined dataset it trains on, and whether it starts from the champion draft
(`student`). It does not train anything itself.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from draftwheel.config import SHIPPED_CONFIGS


@dataclass(frozen=True)
class Trainer:
    name: str
    module: str
    config_class: str
    function: str
    help: str
    dataset: str = "distill"
    """The mined dataset it reads (draftwheel.home.DATASET_KINDS)."""
    student: bool = True
    """It starts from a draft (the champion, in the flywheel); False: it trains on the frozen target alone."""
    example: str = "epochs=1"
    """An override its config takes, shown in `draftwheel train NAME --help` (a test loads it)."""

    @property
    def default_config(self) -> Path:
        """The shipped configs/NAME.yaml: what the flywheel and `draftwheel train NAME` load by default (the
        eagle trainer's differs from its config class's defaults: the tuned round settings live there)."""
        return SHIPPED_CONFIGS / f"{self.name}.yaml"

    def load(self) -> tuple[type, Callable[..., Any]]:
        """(config class, train function), importing the module."""
        module = importlib.import_module(self.module)
        return getattr(module, self.config_class), getattr(module, self.function)


TRAINERS: dict[str, Trainer] = {t.name: t for t in (
    Trainer("distill", "draftwheel.training.distill", "DistillConfig", "train_distill",
            "distil the draft from the target (KD: fkl/rkl/jsd/tvd)", example="loss=tvd"),
    Trainer("dpo", "draftwheel.training.dpo", "DpoConfig", "train_dpo",
            "preference-tune the draft on accept/reject pairs (TRL DPO)", dataset="preference", example="beta=0.2"),
    Trainer("medusa", "draftwheel.training.medusa_train", "MedusaConfig", "train_medusa",
            "train Medusa heads on the frozen target", student=False, example="n_heads=4"),
    Trainer("eagle", "draftwheel.training.eagle_train", "EagleConfig", "train_eagle",
            "train an EAGLE-3 draft (one layer over the target's hidden states, mined draft vocabulary)",
            example="ttt_steps=4"),
)}


def get_trainer(name: str) -> Trainer:
    """The row called `name`; the error names the choices."""
    if name not in TRAINERS:
        raise ValueError(f"trainer: {name!r} is not one of {', '.join(TRAINERS)}")
    return TRAINERS[name]
