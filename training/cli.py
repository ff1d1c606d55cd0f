"""`draftwheel train {distill,dpo,medusa,...} [--config F] [--set KEY=VALUE ...]` and `draftwheel bootstrap`.

Thin wrappers: parse arguments, load the stage's typed config, call the stage function, print the
resulting dir. The trainers come from the one table in `training.trainers`. With no path overrides a
trainer reads what `draftwheel mine` wrote by default and starts from the champion.
torch/transformers/trl/mlflow are imported inside the command functions so `draftwheel --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from draftwheel.config import add_override_arguments
from training.trainers import TRAINERS


def register(subparsers: Any) -> None:
    train = subparsers.add_parser("train", help=f"train a candidate ({', '.join(TRAINERS)})",
                                  description="Train a candidate from the mined datasets.")
    methods = train.add_subparsers(dest="method", metavar="METHOD", required=True)
    for trainer in TRAINERS.values():
        method = methods.add_parser(trainer.name, help=trainer.help, description=trainer.help)
        method.add_argument("--config", help=f"YAML config (default: the shipped configs/{trainer.default_config.name}, "
                                             "as the flywheel trains)")
        method.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
        add_override_arguments(method, "loss=tvd")
        method.set_defaults(func=_train_command)

    boot = subparsers.add_parser("bootstrap", help="reference target + v0 draft, registered as champion",
                                 description="Obtain the reference target offline and build, distil and "
                                             "register the v0 draft (skips what exists).")
    boot.add_argument("--config", help="YAML config (e.g. configs/bootstrap.yaml); defaults if omitted")
    add_override_arguments(boot, "n_prompts=8")
    boot.set_defaults(func=_bootstrap_command)


def _train_command(args: argparse.Namespace) -> int:
    from draftwheel.config import load_config, stage_config_path

    config_cls, train = TRAINERS[args.method].load()
    overrides = list(args.overrides) + (["tracking=false"] if args.no_tracking else [])
    # Without --config, the shipped YAML, as the flywheel trains: the eagle trainer's tuned round settings
    # (continuation, rehearsal, passes) live there, and its bare class defaults are another recipe.
    print(train(load_config(config_cls, stage_config_path(args.config or "", args.method) or None, overrides)))
    return 0


def _bootstrap_command(args: argparse.Namespace) -> int:
    from draftwheel.config import load_config
    from training.bootstrap import BootstrapConfig, bootstrap

    result = bootstrap(load_config(BootstrapConfig, args.config, args.overrides))
    print(json.dumps(result, indent=2, default=str))
    return 0
