"""The plain logic inside the flow tasks: retry policy, training cache key, trainer wiring, the launcher."""

from __future__ import annotations

import subprocess
import sys

import pytest

from draftwheel.config import ConfigError, load_config
from draftwheel.tracking import ArtifactError, RegistryError
from draftwheel.flows import tasks
from draftwheel.flows.flywheel import FlywheelConfig


class NotFound(Exception):
    error_code = "RESOURCE_DOES_NOT_EXIST"


def registry_error(cause: BaseException | None, cls=RegistryError) -> RegistryError:
    try:
        raise cls("registry: something failed") from cause
    except RegistryError as exc:
        return exc


def test_only_transport_and_database_failures_are_retried():
    assert tasks.is_transient(registry_error(OSError("database is locked")))
    assert not tasks.is_transient(registry_error(NotFound()))  # a missing model stays missing
    assert not tasks.is_transient(registry_error(None))  # e.g. "alias 'champion' is not set"
    assert not tasks.is_transient(registry_error(OSError("x"), ArtifactError))  # corrupt files stay corrupt
    assert not tasks.is_transient(ValueError("bug"))
    assert not tasks.is_transient(None)


def test_train_cache_key_follows_every_input(tmp_path):
    config = tmp_path / "distill.yaml"
    config.write_text("epochs: 1\n")
    args = ["distill", "m" * 64, str(config), ["lr=1"], "c" * 64, "t" * 64]
    key = tasks.train_cache_key(*args)
    assert key == tasks.train_cache_key(*args)
    for index, changed in [(0, "dpo"), (1, "n" * 64), (3, ["lr=2"]), (4, "d" * 64), (5, "u" * 64)]:
        assert tasks.train_cache_key(*args[:index], changed, *args[index + 1:]) != key
    config.write_text("epochs: 2\n")  # same path, new contents: a new key
    assert tasks.train_cache_key(*args) != key


def test_stage_overrides_point_each_trainer_at_its_data():
    distill = tasks.stage_overrides("distill", "/d", "/champ", "/target", "/out")
    assert {"dataset=/d/distill", "student=/champ", "target=/target", "output_dir=/out", "holdout=/d/holdout"} == set(
        distill)
    assert "dataset=/d/preference" in tasks.stage_overrides("dpo", "/d", "/champ", "/target", "/out")
    assert not any(o.startswith("student=") for o in tasks.stage_overrides("medusa", "/d", "/c", "/t", "/o"))


def test_launch_command_runs_the_trainer_module_under_the_launcher():
    """`accelerate` is run by the flow's own interpreter (the venv's accelerate, whatever PATH holds); any
    other launcher as written."""
    command = tasks.launch_command("accelerate launch --multi_gpu --num_processes 2", "distill",
                                   "configs/distill.yaml", ["a=1"])
    assert command == [sys.executable, "-m", "accelerate.commands.accelerate_cli", "launch", "--multi_gpu",
                       "--num_processes", "2", "-m", "draftwheel.training.distill", "--config", "configs/distill.yaml",
                       "a=1"]
    assert tasks.launch_command("python", "dpo", "", []) == ["python", "-m", "draftwheel.training.dpo"]
    assert tasks.launch_command("torchrun --nproc_per_node 2", "eagle", "", ["b=2"]) == [
        "torchrun", "--nproc_per_node", "2", "-m", "draftwheel.training.eagle_train", "b=2"]


def test_the_accelerate_launcher_runs_under_this_interpreter():
    done = subprocess.run([*tasks.launcher_argv("accelerate launch"), "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "--num_processes" in done.stdout


@pytest.mark.parametrize("launcher", ["accelerate launch --multi_gpu --num_processes 2", "accelerate launch --cpu",
                                      "accelerate launch --cpu --num_processes 1",
                                      "accelerate launch --cpu --num_processes 4 --mpirun_hostfile hosts",
                                      "accelerate launch --config_file ds.yaml", "torchrun --nproc_per_node 2"])
def test_launchers_that_start_what_they_name_pass(launcher):
    tasks.check_launcher(launcher)
    assert FlywheelConfig(launcher=launcher).launcher == launcher


@pytest.mark.parametrize("launcher, message", [
    ("accelerate launch --cpu --num_processes 2", "would train in one process.*--multi_gpu"),
    ("accelerate launch --cpu --num-processes=2", "would train in one process"),
    ("accelerate launch --num_processes two", "accelerate launch refuses"),
    ("accelerate launch 'unclosed", "cannot split"),
])
def test_a_launcher_that_would_not_start_its_processes_is_refused_naming_the_field(launcher, message):
    """accelerate's --cpu starts several processes only through mpirun; without it the run trains alone."""
    with pytest.raises(ValueError, match=f"^launcher: .*{message}"):
        FlywheelConfig(launcher=launcher)
    with pytest.raises(ConfigError, match="launcher"):
        load_config(FlywheelConfig, None, [f"launcher={launcher}"])


def test_unknown_trainer_names_the_choices():
    with pytest.raises(ValueError, match="distill, dpo, medusa"):
        tasks._resolve_trainer("magic")


def test_datasets_sha256_ignores_the_random_fingerprint_only(tmp_path):
    for name in ("distill", "preference", "holdout"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "data-00000.arrow").write_bytes(name.encode())
        (tmp_path / name / "state.json").write_text('{"_fingerprint": "a"}')
    digest = tasks.datasets_sha256(tmp_path)
    (tmp_path / "distill" / "state.json").write_text('{"_fingerprint": "b"}')
    assert tasks.datasets_sha256(tmp_path) == digest
    (tmp_path / "holdout" / "data-00000.arrow").write_bytes(b"changed")
    assert tasks.datasets_sha256(tmp_path) != digest
