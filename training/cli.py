"""`draftwheel train {distill,dpo,medusa} --config F [key=value ...]` and `draftwheel bootstrap`.

Thin wrappers: parse arguments, load the stage's typed config, call the stage function, print the
resulting dir. torch/transformers/trl/mlflow are imported inside the command functions so
`draftwheel --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

# trainer name -> (module, config class, train function); the flows use the same three names.
TRAINERS = {
    "distill": ("training.distill", "DistillConfig", "train_distill"),
    "dpo": ("training.dpo", "DpoConfig", "train_dpo"),
    "medusa": ("training.medusa_train", "MedusaConfig", "train_medusa"),
}
DEFAULT_CONFIGS = {"distill": "configs/distill.yaml", "dpo": "configs/dpo.yaml", "medusa": "configs/medusa.yaml"}
HELP = {"distill": "distil the draft from the target (KD: fkl/rkl/jsd/tvd)",
        "dpo": "preference-tune the draft on accept/reject pairs (TRL DPO)",
        "medusa": "train Medusa heads on the frozen target"}


def register(subparsers: Any) -> None:
    train = subparsers.add_parser("train", help="train a candidate draft (distill, dpo) or Medusa heads",
                                  description="Train a candidate from the mined datasets.")
    methods = train.add_subparsers(dest="method", metavar="METHOD", required=True)
    for name in TRAINERS:
        method = methods.add_parser(name, help=HELP[name], description=HELP[name])
        method.add_argument("--config", help=f"YAML config (e.g. {DEFAULT_CONFIGS[name]}); defaults if omitted")
        method.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
        method.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. loss=tvd")
        method.set_defaults(func=_train_command)

    boot = subparsers.add_parser("bootstrap", help="reference target + v0 draft, registered as champion",
                                 description="Obtain the reference target offline and build, distil and "
                                             "register the v0 draft (skips what exists).")
    boot.add_argument("--config", help="YAML config (e.g. configs/bootstrap.yaml); defaults if omitted")
    boot.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. n_prompts=8")
    boot.set_defaults(func=_bootstrap_command)


def _train_command(args: argparse.Namespace) -> int:
    import importlib

    from draftwheel.config import load_config

    module_name, config_name, fn_name = TRAINERS[args.method]
    module = importlib.import_module(module_name)
    overrides = list(args.overrides) + (["tracking=false"] if args.no_tracking else [])
    config = load_config(getattr(module, config_name), args.config, overrides)
    print(getattr(module, fn_name)(config))
    return 0


def _bootstrap_command(args: argparse.Namespace) -> int:
    from draftwheel.config import load_config
    from training.bootstrap import BootstrapConfig, bootstrap

    result = bootstrap(load_config(BootstrapConfig, args.config, args.overrides))
    print(json.dumps(result, indent=2, default=str))
    return 0
