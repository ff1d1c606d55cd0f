"""`draftwheel train ...` / `draftwheel bootstrap` argument handling (no training here)."""

from __future__ import annotations

import pytest

from draftwheel.flows.commands import build_parser, main
from draftwheel.config import stage_config_path


def test_train_subcommands_are_registered():
    from draftwheel.training.trainers import TRAINERS

    parser = build_parser()
    for method in TRAINERS:
        args = parser.parse_args(["train", method, "--config", f"configs/{method}.yaml", "lr=1"])
        assert args.method == method and args.overrides == ["lr=1"]
        # One override syntax everywhere: --set KEY=VALUE, or the same pairs bare.
        assert parser.parse_args(["train", method, "--set", "a=1", "b=2"]).overrides == ["a=1", "b=2"]
    assert parser.parse_args(["bootstrap", "n_prompts=4"]).overrides == ["n_prompts=4"]
    assert parser.parse_args(["bootstrap", "--set", "n_prompts=4"]).overrides == ["n_prompts=4"]


def test_a_value_the_config_refuses_is_one_line_exit_2(capsys):
    """Probe 9: `train distill beta=5` printed a ValueError traceback (exit 1)."""
    assert main(["train", "distill", "beta=5"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == ("draftwheel train: config error: "
                           f"{stage_config_path('', 'distill')} with overrides: beta: must be in [0, 1], got 5.0")


def test_unknown_config_field_is_a_config_error_naming_it(capsys):
    assert main(["train", "distill", "--config", "configs/distill.yaml", "no_such_field=1"]) == 2
    assert "no_such_field" in capsys.readouterr().err
    assert main(["bootstrap", "--config", "configs/bootstrap.yaml", "epochs=abc"]) == 2
    assert "epochs" in capsys.readouterr().err


def test_train_requires_a_method():
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train"])


def test_shipped_yaml_files_equal_the_dataclass_defaults():
    """A config loaded without a file (as the flows do by default) behaves like the shipped YAML."""
    from draftwheel.config import load_config
    from draftwheel.training.bootstrap import BootstrapConfig
    from draftwheel.training.distill import DistillConfig
    from draftwheel.training.dpo import DpoConfig
    from draftwheel.training.medusa_train import MedusaConfig

    for cls, name in [(DistillConfig, "distill"), (DpoConfig, "dpo"), (MedusaConfig, "medusa"),
                      (BootstrapConfig, "bootstrap")]:
        assert load_config(cls, f"configs/{name}.yaml") == cls(), name


def test_train_without_config_loads_the_shipped_yaml_the_flywheel_uses():
    """`draftwheel train eagle` with no --config trained with the dataclass defaults (no continuation,
    one pass, plain KL), another recipe than the flywheel's configs/eagle.yaml."""
    from draftwheel.config import load_config
    from draftwheel.training.eagle_train import EagleConfig

    assert stage_config_path("", "eagle").endswith("configs/eagle.yaml")
    assert stage_config_path("mine.yaml", "eagle") == "mine.yaml"
    shipped = load_config(EagleConfig, stage_config_path("", "eagle"))
    assert shipped.continue_to == 96 and shipped.mined_passes == 4 and shipped.prompt_variants == 2
    assert shipped.prompt_renames == 2
    assert shipped != EagleConfig()

