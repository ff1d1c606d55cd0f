"""`draftwheel train {distill,dpo,medusa,...} [--config F] [--set KEY=VALUE ...]` and `draftwheel bootstrap`.

Thin wrappers: parse arguments, load the stage's typed config, call the stage function, print the
resulting dir. The trainers come from the one table in `draftwheel.training.trainers`. With no path overrides a
trainer reads what `draftwheel mine` wrote by default and starts from the champion.
torch/transformers/trl/mlflow are imported inside the command functions so `draftwheel --help` stays fast.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from draftwheel.cli_help import examples
from draftwheel.config import add_override_arguments
from draftwheel.training.trainers import TRAINERS


def register(subparsers: Any) -> None:
    train = subparsers.add_parser("train", help=f"train a candidate ({', '.join(TRAINERS)})",
                                  description="Train a candidate from the mined datasets. Each method reads its "
                                              "own config: by default the shipped configs/<method>.yaml, as the "
                                              "flywheel trains.",
                                  **examples(*(f"draftwheel train {name} --no-tracking {t.example}"
                                               for name, t in TRAINERS.items())))
    methods = train.add_subparsers(dest="method", metavar="METHOD", required=True)
    for trainer in TRAINERS.values():
        config = f"configs/{trainer.default_config.name}"
        method = methods.add_parser(trainer.name, help=trainer.help, description=trainer.help,
                                    **examples(f"draftwheel train {trainer.name}",
                                               f"draftwheel train {trainer.name} --config {config} "
                                               f"--set {trainer.example}",
                                               f"draftwheel train {trainer.name} --no-tracking {trainer.example}"))
        method.add_argument("--config", metavar="FILE",
                            help=f"YAML config (default: the shipped {config}, as the flywheel trains)")
        method.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
        add_override_arguments(method, trainer.example)
        method.set_defaults(func=_train_command)

    boot = subparsers.add_parser("bootstrap", help="a target's v0 draft, registered as champion",
                                 description="Build the v0 draft (eagle3 by default) for the target, trained on "
                                             "its own answers, and register it as champion, tagged with where "
                                             "the target is: every later command given no --target serves and "
                                             "trains for that target. Without --target: the reference target, "
                                             "converted offline once. Skips what exists.",
                                 **examples("draftwheel bootstrap",
                                            "draftwheel bootstrap --target /path/to/my-model",
                                            "draftwheel bootstrap --target Qwen/Qwen2.5-0.5B-Instruct n_prompts=64",
                                            "draftwheel bootstrap --config configs/bootstrap.yaml n_prompts=8"))
    boot.add_argument("--config", metavar="FILE", help="YAML config (e.g. configs/bootstrap.yaml); defaults if omitted")
    boot.add_argument("--target", help="the target: a model dir or a Hugging Face hub id (hub ids need "
                                       "HF_HUB_OFFLINE=0 once); the config's `target`")
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
    from draftwheel.exit_codes import fail
    from draftwheel.tracking import RegistryError
    from draftwheel.training.bootstrap import BootstrapConfig, bootstrap

    overrides = list(args.overrides) + ([f"target={args.target}"] if args.target else [])
    config = load_config(BootstrapConfig, args.config, overrides)  # a ConfigError: the dispatcher's one line
    try:
        result = bootstrap(config)
    except (OSError, RegistryError) as exc:  # the target cannot be loaded, the registry cannot be written
        return fail("bootstrap", exc)
    print(json.dumps(result, indent=2, default=str))
    return 0
