"""Every command's `--help`: a description, examples, and every example a real command line.

The examples are read back from the rendered help (each `draftwheel ...` line of an epilog, and each
`e.g. --set KEY=VALUE` / `e.g. KEY=VALUE` of an option's help), parsed by the real parser (argparse only,
nothing runs) and, for a command that reads a config, loaded into that config the way the command loads
it, so an example naming a field the trainer does not have (`train dpo loss=tvd`) fails here. The
`draftwheel ...` lines of the docs' bash blocks get the same check.
"""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from draftwheel.flows.commands import build_parser
from draftwheel.cli_help import EXAMPLES_HEADER

REPO = Path(__file__).resolve().parents[2]
OPTION_EXAMPLE = re.compile(r"e\.g\. (?:--set )?([A-Za-z_]\w*=[^\s,;)]+)")


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, parser) for every command and sub-command, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from _commands(sub, (*path, name))


def _help(parser: argparse.ArgumentParser, monkeypatch) -> str:
    monkeypatch.setenv("COLUMNS", "1000")  # no wrapping: an example stays on one line
    return parser.format_help()


def _example_lines(text: str) -> list[str]:
    """The `draftwheel ...` lines under the examples header of a help text."""
    if EXAMPLES_HEADER not in text:
        return []
    lines = text.split(EXAMPLES_HEADER, 1)[1].splitlines()
    return [line.strip() for line in lines if line.strip().startswith("draftwheel ")]


COMMANDS = list(_commands(build_parser()))
EXAMPLES = [(path, line) for path, parser in COMMANDS for line in _example_lines(parser.epilog or "")]


def _parse(argv: list[str]) -> argparse.Namespace:
    try:
        return build_parser().parse_args(argv)
    except SystemExit as exc:  # argparse printed why on stderr
        raise AssertionError(f"argparse refused {shlex.join(argv)} (exit {exc.code})") from exc


def _load(args: argparse.Namespace) -> object:
    """The config `args` would run with, loaded as its command loads it (None: the command reads none)."""
    from draftwheel.config import load_config, stage_config_path

    if args.command == "serve":
        from draftwheel.serving.server.cli import build_config

        return build_config(args)
    if args.command == "bench":
        from draftwheel.evaluation.cli import bench_settings

        return bench_settings(args)
    if args.command == "mine":
        from draftwheel.mining.config import MiningConfig

        return load_config(MiningConfig, args.config, args.overrides)
    if args.command == "train":
        from draftwheel.training.trainers import TRAINERS

        path = stage_config_path(args.config or "", args.method) or None
        return load_config(TRAINERS[args.method].load()[0], path, args.overrides)
    if args.command == "bootstrap":
        from draftwheel.training.bootstrap import BootstrapConfig

        return load_config(BootstrapConfig, args.config, args.overrides)
    if args.command == "shadow":
        from draftwheel.cli_help import flag_overrides
        from draftwheel.flows.registry_cli import SHADOW_FLAG_FIELDS
        from draftwheel.evaluation.shadow import ShadowConfig

        return load_config(ShadowConfig, args.config, flag_overrides(args, SHADOW_FLAG_FIELDS))
    if args.command in ("flywheel", "monitor", "demo"):
        from draftwheel.cli_help import flag_overrides
        from draftwheel.flows.cli import FLAG_FIELDS
        from draftwheel.flows.demo import DemoConfig
        from draftwheel.flows.flywheel import FlywheelConfig
        from draftwheel.flows.monitor import MonitorConfig

        cls = {"flywheel": FlywheelConfig, "monitor": MonitorConfig, "demo": DemoConfig}[args.command]
        return load_config(cls, args.config, flag_overrides(args, FLAG_FIELDS))
    if args.command == "deploy":
        from draftwheel.flows.deploy import config_class, flows_of, per_flow_error

        assert not per_flow_error(args), per_flow_error(args)
        return [load_config(config_class(flow), args.config, args.overrides) for flow in flows_of(args)]
    assert not getattr(args, "overrides", None), f"{args.command} takes overrides but the test loads no config"
    return None


def test_the_walk_finds_every_command():
    names = {path for path, _ in COMMANDS}
    assert {("serve",), ("bench",), ("generate",), ("mine",), ("train", "dpo"), ("rollback",), ("demo",)} <= names
    assert len(EXAMPLES) >= 2 * len(COMMANDS)


@pytest.mark.parametrize("path, parser", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_command_has_a_description_and_examples(path, parser, monkeypatch):
    assert parser.description and len(parser.description.split()) >= 5, " ".join(path)
    lines = _example_lines(_help(parser, monkeypatch))
    assert lines and all(shlex.split(line)[1:len(path) + 1] == list(path) for line in lines), lines


@pytest.mark.parametrize("path, line", EXAMPLES, ids=[line for _, line in EXAMPLES])
def test_every_example_parses_and_loads_its_config(path, line, monkeypatch):
    monkeypatch.chdir(REPO)  # examples name the shipped configs/ files
    monkeypatch.delenv("DRAFTWHEEL_API_KEY", raising=False)
    args = _parse(shlex.split(line, comments=True)[1:])
    assert args.func is not None
    _load(args)


@pytest.mark.parametrize("path, parser", COMMANDS, ids=[" ".join(p) for p, _ in COMMANDS])
def test_every_override_shown_in_an_options_help_loads(path, parser, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("DRAFTWHEEL_API_KEY", raising=False)
    text = _help(parser, monkeypatch).split(EXAMPLES_HEADER)[0]
    shown = set(OPTION_EXAMPLE.findall(text))
    has_overrides = any(a.dest == "overrides" for a in parser._actions)
    assert bool(shown) == has_overrides, (path, shown)  # a command that takes overrides shows one
    base = shlex.split(_example_lines(parser.epilog or "")[0], comments=True)[1:]  # has the required flags
    for override in shown:
        _load(_parse([*base, "--set", override]))
        assert _parse([*base, override]).overrides[-1] == override  # bare, the same
    for config in re.findall(r"configs/[\w.-]+\.yaml", text):
        assert (REPO / config).is_file(), config


def _doc_examples() -> list[tuple[str, str]]:
    """(file, line) for each `draftwheel ...` line in a ```bash block of README.md and docs/*.md, except
    synopses and placeholders (a line with `[` or `<`); a `\\` continuation joins the next line."""
    found = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        language = None
        for line in path.read_text().replace("\\\n", " ").splitlines():
            if line.startswith("```"):
                language = None if language is not None else line[3:].strip()
            elif language == "bash" and line.startswith("draftwheel ") and not set("[<") & set(line):
                found.append((path.name, line))
    return found


DOC_EXAMPLES = _doc_examples()


@pytest.mark.parametrize("name, line", DOC_EXAMPLES, ids=[line for _, line in DOC_EXAMPLES])
def test_the_docs_command_lines_parse_and_load_their_config(name, line, monkeypatch):
    monkeypatch.chdir(REPO)
    monkeypatch.delenv("DRAFTWHEEL_API_KEY", raising=False)
    _load(_parse(shlex.split(line, comments=True)[1:]))


def test_help_imports_nothing_heavy():
    """Building every parser (what `draftwheel --help` does) loads no torch, transformers, prefect or mlflow."""
    import subprocess
    import sys

    code = ("import sys; from draftwheel.flows.commands import build_parser; build_parser(); "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'transformers', 'prefect', 'mlflow'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr
