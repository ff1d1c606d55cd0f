"""Shared pieces of the command line's grammar that are not about configs: example epilogs, the help
formatter that keeps them as written, the `--log-dir` flag and deprecated aliases of old flag spellings.

Every example a command shows is a full `draftwheel ...` line in its epilog; tests/draftwheel/
test_cli_help.py parses each one with the real parser, so an example cannot drift from the flags. The
override flags (`--set KEY=VALUE`, bare `KEY=VALUE`) live in `draftwheel.config.add_override_arguments`.
This module imports nothing heavy: `draftwheel --help` builds every parser.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

EXAMPLES_HEADER = "examples:"
LOG_DIR_HELP = "the acceptance log dir `draftwheel serve` writes (default: $DRAFTWHEEL_HOME/logs)"


class HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that a paragraph written over several lines (an epilog's examples)
    keeps its lines; one-line paragraphs (descriptions) are wrapped as usual."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        filled = []
        for paragraph in text.split("\n\n"):
            if "\n" in paragraph:
                filled.append("\n".join(indent + line for line in paragraph.splitlines()))
            else:
                filled.append(super()._fill_text(paragraph, width, indent))
        return "\n\n".join(filled)


def examples(*lines: str) -> dict[str, Any]:
    """`add_parser` keywords giving a command an examples epilog (each line a full `draftwheel ...`
    command, optionally followed by `  # comment`)."""
    return {"epilog": EXAMPLES_HEADER + "\n" + "\n".join(f"  {line}" for line in lines),
            "formatter_class": HelpFormatter}


def flag_overrides(args: argparse.Namespace, fields: dict[str, str]) -> list[str]:
    """`args.overrides` with each flag given (`fields`: flag dest -> config field) appended as
    `field=value`, so the flags win over the overrides, as over the file."""
    return [*args.overrides, *(f"{field}={getattr(args, name)}" for name, field in fields.items()
                               if getattr(args, name, None) is not None)]


def add_log_dir(parser: argparse.ArgumentParser, help: str = LOG_DIR_HELP, **kwargs: Any) -> None:
    """`--log-dir DIR`: the serving acceptance log dir, the same flag on every command that reads or writes it."""
    parser.add_argument("--log-dir", dest="log_dir", metavar="DIR", help=help, **kwargs)


class _DeprecatedAlias(argparse.Action):
    """Store as the new flag does, and say once on stderr that the old spelling is deprecated."""

    def __init__(self, *args: Any, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(*args, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        print(f"{parser.prog}: {option_string} is deprecated, use {self.new}", file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_deprecated_alias(parser: argparse.ArgumentParser, old: str, new: str, dest: str, **kwargs: Any) -> None:
    """Accept `old` as a hidden spelling of the flag `new` (same `dest`), for scripts written against it."""
    parser.add_argument(old, dest=dest, action=_DeprecatedAlias, new=new, help=argparse.SUPPRESS,
                        default=argparse.SUPPRESS, **kwargs)
