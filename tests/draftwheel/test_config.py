"""draftwheel.config: a value means what its field's type says, whichever way it arrives (a YAML file, a
`key=value` override), and every refusal is one line naming the field and the file.

Each case below pairs the accepted spellings with the refused ones; the refused ones were accepted
before (`name=007` became "7", `name=yes` became "True", a bool took 2, a float took nan, a YAML alias
was expanded).
"""

from __future__ import annotations

import importlib
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import pytest

from draftwheel.config import ConfigError, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@dataclass
class Toy:
    """One field of each kind the loader types."""

    name: str = "x"
    flag: bool = False
    n: int = 1
    lr: float = 0.1
    maybe: str | None = "a"
    limit: float | None = None
    where: Path = Path(".")
    names: list[str] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    tolerances: dict[str, float] = field(default_factory=dict)
    untyped: dict = field(default_factory=dict)
    auto_or_bool: bool | str = "auto"


def override(*items: str) -> Toy:
    return load_config(Toy, None, list(items))


def from_file(tmp_path: Path, text: str) -> Toy:
    path = tmp_path / "toy.yaml"
    path.write_text(text)
    return load_config(Toy, path)


def refused(match: str, load: Any, *args: Any) -> str:
    """The one-line message of the ConfigError that `load(*args)` raises, which must match `match`."""
    with pytest.raises(ConfigError, match=match) as info:
        load(*args)
    message = str(info.value)
    assert "\n" not in message, message
    return message


# --- strings keep their text -------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("007", "007"),          # was "7": YAML read an int
    ("yes", "yes"),          # was "True": YAML 1.1 read a bool
    ("1:20", "1:20"),        # YAML 1.1 would read sexagesimal 80
    ("1e3", "1e3"),
    ("null", "null"),        # a str field cannot be None: the text is the value
    ("foo: bar", "foo: bar"),  # was "{'foo': 'bar'}"
    ("[a, b]", "[a, b]"),
    ("&a x", "&a x"),        # an anchor in a string override is text, not YAML
    ('"quoted"', "quoted"),  # one quoted YAML string is unquoted (flows build overrides with json.dumps)
    ("", ""),
])
def test_a_string_override_keeps_its_raw_text(text, expected):
    config = override(f"name={text}")
    assert config.name == expected and type(config.name) is str


def test_a_string_in_a_file_keeps_its_text(tmp_path):
    config = from_file(tmp_path, "name: 007\nmaybe: yes\nnames: [007, on, 1.50]\n")
    assert (config.name, config.maybe, config.names) == ("007", "yes", ["007", "on", "1.50"])
    assert type(config.name) is str and all(type(v) is str for v in config.names)


def test_optional_fields_take_null_but_an_empty_override_is_the_empty_string():
    assert override("maybe=null").maybe is None and override("maybe=~").maybe is None
    assert override("maybe=007").maybe == "007"
    # `api_key=$KEY` with KEY unset arrives as `api_key=`: it must reach the field as "" so it is refused
    assert override("maybe=").maybe == ""
    assert override("limit=null").limit is None and override("limit=0.5").limit == 0.5


def test_a_path_field_keeps_its_text():
    assert override("where=2024-01-01").where == Path("2024-01-01")  # YAML 1.1 would read a date


# --- bool ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("true", True), ("True", True), ("TRUE", True), ("yes", True), ("Yes", True), ("on", True), ("ON", True),
    ("false", False), ("False", False), ("no", False), ("NO", False), ("off", False), ("Off", False),
])
def test_a_bool_takes_the_yaml_spellings_in_any_case(text, expected):
    assert override(f"flag={text}").flag is expected


@pytest.mark.parametrize("text", ["2", "1", "0", "-1", "maybe", "", "y", "1.0", "[true]"])
def test_a_bool_refuses_everything_else(text):
    message = refused("flag: expected bool", override, f"flag={text}")
    assert message.startswith("overrides: flag:")


def test_a_bool_in_a_file_refuses_a_number_and_names_the_file(tmp_path):
    assert from_file(tmp_path, "flag: yes\n").flag is True
    message = refused("flag: expected bool, got '2'", from_file, tmp_path, "flag: 2\n")
    assert "toy.yaml" in message


# --- int -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [("3", 3), ("-3", -3), ("+3", 3), ("007", 7), ("1_000", 1000)])
def test_an_int_takes_integers(text, expected):
    assert override(f"n={text}").n == expected and type(override(f"n={text}").n) is int


@pytest.mark.parametrize("text", ["2.5", "2.0", "True", "true", "1e3", "0x10", "", "nan", "[1]", "٣"])
def test_an_int_refuses_everything_else(text):
    refused("n: expected int", override, f"n={text}")


def test_an_int_in_a_file_refuses_a_float_and_a_bool(tmp_path):
    assert from_file(tmp_path, "n: 12\n").n == 12
    refused(r"toy.yaml: n: expected int, got '2.5'", from_file, tmp_path, "n: 2.5\n")
    refused(r"toy.yaml: n: expected int, got 'true'", from_file, tmp_path, "n: true\n")
    refused(r"toy.yaml: sizes: expected int, got 'x'", from_file, tmp_path, "sizes: [1, x]\n")


# --- float -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, expected", [("0.5", 0.5), ("1e-4", 1e-4), ("3", 3.0), ("-2.5E+2", -250.0),
                                            (".5", 0.5)])
def test_a_float_takes_finite_numbers(text, expected):
    assert override(f"lr={text}").lr == expected


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", ".inf", "-.inf", ".nan", "1e400",
                                  "true", "", "fast"])
def test_a_float_refuses_nan_infinities_and_words(text):
    """No float field of the shipped configs means "unbounded" by inf (their limits use 0 or None for
    "none"), so every float field is held to finite numbers; nan would make every comparison false."""
    refused("lr: expected a finite float", override, f"lr={text}")


def test_a_float_in_a_file_or_a_mapping_refuses_nan_naming_the_key(tmp_path):
    refused(r"toy.yaml: lr: expected a finite float, got '.nan'", from_file, tmp_path, "lr: .nan\n")
    refused(r"toy.yaml: lr: expected a finite float", from_file, tmp_path, "lr: !!float .inf\n")
    refused(r"tolerances.code: expected a finite float, got '.inf'", override, "tolerances={code: .inf}")
    assert override("tolerances={code: 0.02}").tolerances == {"code": 0.02}


def test_a_shipped_config_refuses_nan_where_it_once_disabled_the_gate():
    """`min_gain=nan` used to load, and `ci_low > nan` is false for every report: no challenger could
    ever be promoted, and nothing said why."""
    from draftwheel.evaluation.shadow import ShadowConfig

    message = refused("min_gain: expected a finite float, got 'nan'", load_config, ShadowConfig,
                      CONFIGS / "shadow.yaml", ["min_gain=nan"])
    assert "shadow.yaml" in message


# --- lists, mappings, untyped and mixed fields ---------------------------------------------------------

def test_lists_take_a_yaml_list_or_comma_separated_text():
    assert override("names=a,b").names == ["a", "b"]
    assert override('names=["a", "007"]').names == ["a", "007"]
    assert override("sizes=[1, 2]").sizes == [1, 2] and override("sizes=3,4").sizes == [3, 4]
    assert override("names=").names == []


def test_untyped_fields_get_yaml_values_and_mixed_fields_try_their_types_in_order():
    assert override("untyped={code: 0.4, on: yes}").untyped == {"code": 0.4, True: True}
    assert override("auto_or_bool=auto").auto_or_bool == "auto"
    assert override("auto_or_bool=yes").auto_or_bool is True and override("auto_or_bool=OFF").auto_or_bool is False


# --- YAML anchors and aliases ----------------------------------------------------------------------------

def test_a_file_with_an_alias_is_refused_naming_the_file(tmp_path):
    message = refused(r"toy.yaml: YAML anchors and aliases .* \(line 2\)", from_file, tmp_path,
                      "lr: 0.5\nname: &shared plain\nmaybe: *shared\n")
    assert "toy.yaml" in message


def test_an_alias_bomb_is_refused_before_it_expands(tmp_path):
    """A real field holding six levels of ten aliases: its last item is 10**6 strings once expanded (the
    old loader turned it into a multi-megabyte string; three more levels is gigabytes). The refusal
    reads only the token stream, so it costs what reading the short file costs."""
    levels = ["&l0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 7)]
    refused(r"toy.yaml: YAML anchors and aliases", from_file, tmp_path, f"names: [{', '.join(levels)}]\n")


def test_an_override_with_an_alias_is_refused():
    refused(r"names: YAML anchors and aliases", override, "names=[&a [x, x], *a, *a]")


# --- one line, naming the file -----------------------------------------------------------------------

def test_a_yaml_syntax_error_is_one_line_naming_the_file(tmp_path):
    message = refused(r"toy.yaml: not valid YAML", from_file, tmp_path, "name: [unclosed\nlr: 1\n")
    assert "line" in message


def test_unknown_fields_and_missing_files_are_still_refused(tmp_path):
    refused(r"overrides: unknown field\(s\) nme for Toy", override, "nme=1")
    refused(r"config file not found", load_config, Toy, tmp_path / "absent.yaml")
    refused(r"toy.yaml: expected a mapping at the top level", from_file, tmp_path, "- a\n- b\n")
    assert from_file(tmp_path, "# only a comment\n") == Toy()


# --- the shipped configs load under these rules --------------------------------------------------------

SHIPPED = {
    "bootstrap": "draftwheel.training.bootstrap:BootstrapConfig", "demo": "draftwheel.flows.demo:DemoConfig",
    "distill": "draftwheel.training.distill:DistillConfig", "dpo": "draftwheel.training.dpo:DpoConfig",
    "eagle": "draftwheel.training.eagle_train:EagleConfig", "flywheel": "draftwheel.flows.flywheel:FlywheelConfig",
    "medusa": "draftwheel.training.medusa_train:MedusaConfig", "mining": "draftwheel.mining.config:MiningConfig",
    "monitor": "draftwheel.flows.monitor:MonitorConfig", "serve": "draftwheel.serving.server.serve_config:ServeConfig",
    "shadow": "draftwheel.evaluation.shadow:ShadowConfig",
}


def test_every_shipped_config_is_listed():
    assert sorted(SHIPPED) == sorted(p.stem for p in CONFIGS.glob("*.yaml"))


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_every_shipped_config_loads_with_finite_floats(name):
    module, cls_name = SHIPPED[name].split(":")
    config = load_config(getattr(importlib.import_module(module), cls_name), CONFIGS / f"{name}.yaml")
    for f in fields(config):
        value = getattr(config, f.name)
        if isinstance(value, float):
            assert math.isfinite(value), f.name
