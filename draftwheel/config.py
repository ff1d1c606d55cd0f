"""Typed stage configs: dataclasses loaded from `configs/*.yaml` with `key=value` CLI overrides.

Unknown keys are rejected and every error names the offending field, so a typo in a YAML file fails
loudly instead of silently falling back to a default. Validation of values lives in each config's
`__post_init__` (raise `ValueError` naming the field); it reaches callers as `ConfigError`.

Every command takes overrides the same way, through `add_override_arguments`: `--set KEY=VALUE`
(repeatable), or the same `KEY=VALUE` pairs bare after the options; both land in `args.overrides`.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the field."""


def _coerce(field_name: str, value: Any, annotation: Any) -> Any:
    """Coerce YAML/CLI scalars to the field's declared type (str -> int/float/bool, list of ...)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        non_none = [a for a in args if a is not type(None)]
        return _coerce(field_name, value, non_none[0]) if len(non_none) == 1 else value
    if origin in (list, tuple):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{field_name}: expected a list, got {value!r}")
        inner = args[0] if args else Any
        return [_coerce(field_name, v, inner) for v in value]
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{field_name}: expected a mapping, got {value!r}")
        return value
    try:
        if annotation is bool:
            if isinstance(value, str):
                lowered = value.strip().lower()
                if lowered in ("true", "1", "yes", "on"):
                    return True
                if lowered in ("false", "0", "no", "off"):
                    return False
                raise ValueError(value)
            return bool(value)
        if annotation in (int, float):
            if isinstance(value, bool):
                raise ValueError(value)
            result = annotation(value)
            if annotation is int and isinstance(value, float) and value != result:
                raise ValueError(value)
            return result
        if annotation is str:
            return str(value)
        if annotation is Path:
            return Path(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{field_name}: expected {annotation.__name__}, got {value!r}") from exc
    return value


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
    kwargs = {name: _coerce(name, value, hints[name]) for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as exc:  # a required field is missing, or __post_init__ refused a value
        raise ConfigError(f"{source}: {exc}") from exc


def parse_overrides(overrides: list[str] | None) -> dict[str, Any]:
    """`["lr=1e-4", "lora=true"]` -> {"lr": "1e-4", "lora": "true"} (types are coerced later)."""
    result: dict[str, Any] = {}
    for item in overrides or []:
        if "=" not in item:
            raise ConfigError(f"override {item!r}: expected key=value")
        key, value = item.split("=", 1)
        result[key.strip()] = yaml.safe_load(value) if value else value
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


SHIPPED_CONFIGS = Path(__file__).resolve().parents[1] / "configs"


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
            loaded = yaml.safe_load(Path(path).read_text())
        except FileNotFoundError as exc:
            raise ConfigError(f"config file not found: {path}") from exc
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
        data = loaded or {}
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping at the top level")
    if overrides and path is not None:
        source = f"{path} with overrides"
    data.update(parse_overrides(overrides))
    return from_dict(cls, data, source)


def to_dict(config: Any) -> dict[str, Any]:
    """A config as plain data (for MLflow params, registry tags, JSON)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(config).items()}
