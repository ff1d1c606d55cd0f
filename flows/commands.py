"""The `draftwheel` command line: a thin dispatcher.

Each stage package owns its commands in a light `cli` module exposing `register(subparsers)`; heavy
imports (torch, transformers, mlflow, prefect) happen inside the command functions so `--help` is fast.
Exit codes follow `draftwheel.exit_codes`: 2 for an input the user can fix, 1 when the work failed.

One grammar for every command: a command that reads a config takes `--config FILE`, `--set KEY=VALUE`
(repeatable) and the same pairs bare; the serving flags (`--k`, `--min-path-prob`, `--dtype`,
`--served-model-name`, `--log-dir`) are defined once (`draftwheel.serving.server.cli_flags`, `draftwheel.cli_help`) and
mean the same config field wherever they apply. Every command has a description (from its module, or
from `DESCRIPTIONS` below for a module that gives none) and its examples are parsed by a test.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from draftwheel.cli_help import examples
from draftwheel.config import ConfigError
from draftwheel.exit_codes import USAGE
from draftwheel.home import apply_offline_defaults
from draftwheel.tracking import ArtifactError

# Order here is the order of the commands in `draftwheel --help`.
COMMAND_MODULES = ["draftwheel.serving.server.engine_cli", "draftwheel.evaluation.cli", "draftwheel.serving.server.cli", "draftwheel.serving.server.proxy_cli", "draftwheel.mining.cli", "draftwheel.mining.ingest_cli", "draftwheel.training.cli", "draftwheel.flows.registry_cli", "draftwheel.flows.cli", "draftwheel.flows.deploy"]
# `draftwheel COMMAND --help` descriptions and examples for commands whose module registers none.
DESCRIPTIONS = {
    "rollback": "Swap the champion and previous aliases of a registered model (checked and locked, all or "
                "nothing; a second rollback undoes the first). A `draftwheel serve` that follows the champion "
                "alias reloads the draft.",
    "status": "Print every version of every registered model with its aliases and key figures (shadow "
              "verdict, delivered gain), then the target commands given no --target use, the flywheel's retained "
              "corpus and the serving suffix index's size and hit rate (text output only).",
}
EXAMPLES = {
    "shadow": ("draftwheel shadow --challenger /path/to/candidate-dir",
               "draftwheel shadow --challenger models:/draftwheel-draft/3 --promote --set min_requests=8"),
    "promote": ("draftwheel promote 3", "draftwheel promote 2 --model draftwheel-medusa"),
    "rollback": ("draftwheel rollback", "draftwheel rollback --model draftwheel-medusa"),
    "status": ("draftwheel status", "draftwheel status --json"),
}
GRAMMAR = ("Commands that read a config take --config FILE and overrides, --set KEY=VALUE (repeatable) or the "
           "same KEY=VALUE pairs bare after the options; flags win over overrides, overrides over the file. "
           "Each command's --help ends with examples.")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="draftwheel",
        description="Continual distillation of speculative-decoding draft models: "
                    "serve -> mine -> train -> shadow -> promote.",
        epilog=GRAMMAR,
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
    _fill_in_help(subparsers.choices)
    return parser


def _fill_in_help(commands: dict[str, argparse.ArgumentParser]) -> None:
    """Give a command without a description or examples the ones `DESCRIPTIONS` / `EXAMPLES` hold."""
    for name, command in commands.items():
        if not command.description and name in DESCRIPTIONS:
            command.description = DESCRIPTIONS[name]
        if not command.epilog and name in EXAMPLES:
            help_keywords = examples(*EXAMPLES[name])
            command.epilog, command.formatter_class = help_keywords["epilog"], help_keywords["formatter_class"]


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
