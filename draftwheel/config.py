"""Typed stage configs: dataclasses loaded from `configs/*.yaml` with `key=value` CLI overrides.

Unknown keys are rejected and every error names the offending field, so a typo in a YAML file fails
loudly instead of silently falling back to a default. Validation of values lives in each config's
`__post_init__` (raise `ValueError` naming the field); it reaches callers as `ConfigError`.

A value is typed by the field it lands in, not by YAML's guess: an unquoted scalar in a file and an
override's text stay text until then, so `name=007` is "007" in a `str` field and 7 in an `int` one.
`bool` takes true/false/yes/no/on/off in any case (and real booleans), `int` only integers, `float`
only finite numbers. Files with YAML anchors or aliases are refused before anything is built. Every
error is one line naming the file (or the overrides) and the field. This module checks types only:
ranges and relations between fields are each config's own `__post_init__`.

Every command takes overrides the same way, through `add_override_arguments`: `--set KEY=VALUE`
(repeatable), or the same `KEY=VALUE` pairs bare after the options; both land in `args.overrides`.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field."""


_PLAIN_TAG = "tag:draftwheel,plain"
_NULLS = ("", "~", "null", "Null", "NULL")
_BOOLS = {"true": True, "yes": True, "on": True, "false": False, "no": False, "off": False}
_INT = re.compile(r"[-+]?[0-9](?:_?[0-9])*")
_SCALARS = (bool, int, float, str, Path)


class _Plain(str):
    """An unquoted YAML scalar, kept as its text: the field it lands in decides its type."""


class _Override(str):
    """A command-line `key=value` value, kept as its raw text until the field's type is known."""


class _TextLoader(yaml.SafeLoader):
    """SafeLoader that keeps every plain (unquoted, untagged) scalar as `_Plain` text instead of guessing
    its type, so `007` stays "007" in a string field. Quoted and explicitly tagged scalars load as usual."""

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        if kind is yaml.ScalarNode and implicit[0]:
            return _PLAIN_TAG
        return super().resolve(kind, value, implicit)


_TextLoader.add_constructor(_PLAIN_TAG, lambda loader, node: _Plain(node.value))


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _show(value: Any) -> str:
    """A value for an error message: its repr, cut to one short line."""
    text = repr(str(value) if isinstance(value, str) else value)
    return text if len(text) <= 80 else text[:77] + "..."


def _parse_yaml(text: str, source: str) -> Any:
    """YAML text -> data with plain scalars as `_Plain`. Anchors and aliases are refused from the token
    stream, before anything is built: an alias bomb a few lines long otherwise expands to gigabytes."""
    try:
        for token in yaml.scan(text, Loader=yaml.SafeLoader):
            if isinstance(token, (yaml.AnchorToken, yaml.AliasToken)):
                raise ConfigError(f"{source}: YAML anchors and aliases (&name, *name) are not allowed "
                                  f"(line {token.start_mark.line + 1}); write the values out")
        data = yaml.load(text, Loader=_TextLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {_one_line(exc)}") from exc
    return _Plain("") if data is None else data  # an empty document is an empty plain scalar


def _data(value: Any, field_name: str) -> Any:
    """An override's text parsed as YAML (lists, mappings); any other value as it is."""
    return _parse_yaml(value, field_name) if isinstance(value, _Override) else value


def _yaml_value(text: str) -> Any:
    """What YAML's own resolution makes of a plain scalar's text (for fields with no declared type)."""
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(yaml.ScalarNode(loader.resolve(yaml.ScalarNode, text, (True, False)), text))
    finally:
        loader.dispose()


def _resolve(field_name: str, value: Any) -> Any:
    """Data with every plain scalar replaced by the value YAML's own rules give it (untyped fields)."""
    value = _data(value, field_name)
    if isinstance(value, _Plain):
        return _yaml_value(value)
    if isinstance(value, dict):
        return {_resolve(field_name, k): _resolve(field_name, v) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(field_name, v) for v in value]
    return str(value) if isinstance(value, str) else value


def _is_null(value: Any) -> bool:
    """A YAML null: a missing value, or a plain `null`/`~`/empty scalar. An empty override (`key=`) is the
    empty string, not null: it is how an unset shell variable arrives, and a field such as `api_key` must
    see it to refuse it."""
    if isinstance(value, _Override) and not value.strip():
        return False
    try:
        value = _data(value, "override")
    except ConfigError:
        return False
    return value is None or (isinstance(value, _Plain) and value in _NULLS)


def _text(value: Any) -> str:
    """A string field's value: an override's raw text (unless it is one quoted YAML string), a scalar's text."""
    if isinstance(value, _Override):
        try:
            parsed = _data(value, "override")
        except ConfigError:
            parsed = None
        return str(parsed) if isinstance(parsed, str) and not isinstance(parsed, _Plain) else str(value)
    if isinstance(value, str):
        return str(value)
    raise ValueError(value)


def _scalar(value: Any, annotation: Any) -> Any:
    """bool, int, float, str or Path from a scalar; ValueError when the text does not mean one."""
    if annotation is str:
        return _text(value)
    if annotation is Path:
        return Path(_text(value))
    if isinstance(value, str):
        value = _text(value).strip()
    if annotation is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in _BOOLS:
            return _BOOLS[value.lower()]
        raise ValueError(value)
    if isinstance(value, bool):
        raise ValueError(value)
    if annotation is int:
        if isinstance(value, int):
            return value
        if isinstance(value, str) and _INT.fullmatch(value):
            return int(value)
        raise ValueError(value)
    result = float(value) if isinstance(value, (int, float, str)) else float("nan")
    if not math.isfinite(result):
        raise ValueError(value)
    return result


def _coerce(field_name: str, value: Any, annotation: Any) -> Any:
    """Turn YAML data and override text into the field's declared type (bool, int, float, str, Path,
    list/tuple of one, dict[K, V], or Optional of one); other annotations get YAML's own reading."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if type(None) in args and _is_null(value):
            return None
        non_none = [a for a in args if a is not type(None)]
        if len(non_none) == 1:
            return _coerce(field_name, value, non_none[0])
        if not all(a in _SCALARS for a in non_none):
            return _resolve(field_name, value)
        for member in non_none:  # e.g. `bool | str`: "yes" is True, "auto" stays "auto"
            try:
                return _scalar(value, member)
            except (TypeError, ValueError):
                pass
        raise ConfigError(f"{field_name}: expected {' or '.join(a.__name__ for a in non_none)}, got {_show(value)}")
    if origin in (list, tuple):
        value = _data(value, field_name)
        if isinstance(value, str):
            value = [_Plain(v) for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{field_name}: expected a list, got {_show(value)}")
        inner = args[0] if args else Any
        return [_coerce(field_name, v, inner) for v in value]
    if origin is dict or annotation is dict:
        value = _data(value, field_name)
        if not isinstance(value, dict):
            raise ConfigError(f"{field_name}: expected a mapping, got {_show(value)}")
        key_type, value_type = args if len(args) == 2 else (Any, Any)
        return {_coerce(field_name, k, key_type): _coerce(f"{field_name}.{k}", v, value_type)
                for k, v in value.items()}
    if annotation in _SCALARS:
        try:
            return _scalar(value, annotation)
        except (TypeError, ValueError) as exc:
            what = "a finite float" if annotation is float else annotation.__name__
            raise ConfigError(f"{field_name}: expected {what}, got {_show(value)}") from exc
    return _resolve(field_name, value)


def from_dict(cls: type[T], data: dict[str, Any], source: str = "config") -> T:
    """Build dataclass `cls` from a mapping, rejecting unknown keys and naming bad fields."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level, got {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{source}: unknown field(s) {', '.join(unknown)} for {cls.__name__}; "
                          f"known: {', '.join(sorted(fields))}")
    try:
        kwargs = {name: _coerce(name, value, hints[name]) for name, value in data.items()}
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a required field is missing, or __post_init__ refused a value
        raise ConfigError(f"{source}: {_one_line(exc)}") from exc


def parse_overrides(overrides: list[str] | None) -> dict[str, Any]:
    """`["lr=1e-4", "name=007"]` -> {"lr": "1e-4", "name": "007"}: each value stays its raw text until
    the field's type is known, so a string field gets exactly what was typed (a quoted YAML string is
    unquoted), and only list, mapping and untyped fields parse it as YAML."""
    result: dict[str, Any] = {}
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {_show(item)}: expected key=value")
        key, value = item.split("=", 1)
        result[key.strip()] = _Override(value)
    return result


class _ExtendOverrides(argparse.Action):
    """Bare `KEY=VALUE` arguments join the `--set` ones in `args.overrides`, in command-line order."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, "overrides", list(getattr(namespace, "overrides", None) or []) + list(values))


def add_override_arguments(parser: argparse.ArgumentParser, example: str = "key=value") -> None:
    """The one override syntax of the command line: `--set KEY=VALUE` (repeatable) or bare `KEY=VALUE`
    pairs, both collected in `args.overrides` and applied by `load_config`."""
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help=f"override a config field (repeatable), e.g. --set {example}")
    parser.add_argument("bare_overrides", nargs="*", action=_ExtendOverrides, metavar="KEY=VALUE",
                        help=f"the same overrides without --set, e.g. {example}")


def _shipped_configs() -> Path:
    """The shipped configs: inside the installed package, else the checkout's configs/ (an editable install)."""
    installed = Path(__file__).resolve().parent / "configs"
    return installed if installed.is_dir() else Path(__file__).resolve().parents[1] / "configs"


SHIPPED_CONFIGS = _shipped_configs()


def stage_config_path(path: str, name: str) -> str:
    """A stage's config file: `path` when given, else the shipped `configs/<name>.yaml` (tuned defaults)
    when this checkout has it, else "" (the config dataclass's own defaults). The flows and `draftwheel
    train` both resolve through here, so a stage trained by hand uses the flywheel's settings."""
    if path:
        return path
    shipped = SHIPPED_CONFIGS / f"{name}.yaml"
    return str(shipped) if shipped.is_file() else ""


def load_config(cls: type[T], path: str | Path | None = None, overrides: list[str] | None = None) -> T:
    """Load `cls` from a YAML file (optional) and apply `key=value` overrides."""
    data: dict[str, Any] = {}
    source = "overrides"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text()
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        loaded = _parse_yaml(text, source)
        if not isinstance(loaded, dict) and not _is_null(loaded):
            raise ConfigError(f"{path}: expected a mapping at the top level")
        data = {str(key): value for key, value in (loaded if isinstance(loaded, dict) else {}).items()}
    if overrides and path is not None:
        source = f"{path} with overrides"
    data.update(parse_overrides(overrides))
    return from_dict(cls, data, source)


def to_dict(config: Any) -> dict[str, Any]:
    """A config as plain data (for MLflow params, registry tags, JSON)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(config).items()}
