"""The `draftwheel` command line: a thin dispatcher.

Each stage package owns its commands in a light `cli` module exposing `register(subparsers)`; heavy
imports (torch, transformers, mlflow, prefect) happen inside the command functions so `--help` is fast.
Exit codes follow `draftwheel.exit_codes`: 2 for an input the user can fix, 1 when the work failed.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from draftwheel.config import ConfigError
from draftwheel.exit_codes import USAGE
from draftwheel.home import apply_offline_defaults
from draftwheel.tracking import ArtifactError

# Order here is the order of the commands in `draftwheel --help`.
COMMAND_MODULES = ["serving.engine_cli", "serving.server_cli", "mining.cli", "training.cli", "draftwheel.registry_cli", "flows.cli"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftwheel",
        description="Continual distillation of speculative-decoding draft models: "
                    "serve -> mine -> train -> shadow -> promote.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:  # a real missing dependency, not a not-yet-written module
                raise
            continue
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    apply_offline_defaults()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return USAGE
    try:
        result = args.func(args)
    except ConfigError as exc:
        print(f"draftwheel {args.command}: config error: {exc}", file=sys.stderr)
        return USAGE
    except ArtifactError as exc:  # a registry version serving/training cannot use: its files are gone
        print(f"draftwheel {args.command}: {exc}", file=sys.stderr)
        return USAGE
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
