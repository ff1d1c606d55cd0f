"""The flow commands' argument handling (no Prefect server is started by these)."""

from __future__ import annotations

import os
import subprocess
import sys

from draftwheel.flows.commands import main


def test_bad_config_fails_fast_with_the_field_named(capsys):
    assert main(["flywheel", "trainer=magic"]) == 2
    assert "trainer" in capsys.readouterr().err
    assert main(["monitor", "min_acceptance=7"]) == 2
    assert "min_acceptance" in capsys.readouterr().err
    assert main(["demo", "eval_requests=0"]) == 2
    assert "eval_requests" in capsys.readouterr().err


def test_stage_configs_are_checked_before_anything_starts(capsys):
    """Probe 10: every stage's sub-config, for the flywheel and for the flywheel a monitor or the demo starts."""
    from draftwheel.flows.flywheel import override

    assert main(["flywheel", "--set", override("shadow_overrides", ["no_such_field=1"])]) == 2
    err = capsys.readouterr().err
    assert "shadow stage" in err and "no_such_field" in err and len(err.strip().splitlines()) == 1
    assert main(["flywheel", override("mining_overrides", ["holdout_fraction=2"])]) == 2
    assert "mining stage" in capsys.readouterr().err
    assert main(["monitor", override("flywheel_overrides", [override("train_overrides", ["beta=5"])])]) == 2
    err = capsys.readouterr().err
    assert "train stage" in err and "beta" in err
    assert main(["demo", override("shadow_overrides", ["no_such_field=1"])]) == 2
    assert "no_such_field" in capsys.readouterr().err


def test_schedule_without_a_prefect_server_explains_what_to_start(tmp_path):
    # A subprocess: the session's Prefect test server would otherwise count as a configured API.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["DRAFTWHEEL_HOME"] = str(tmp_path / "home")
    result = subprocess.run([sys.executable, "-m", "draftwheel.flows.commands", "flywheel", "--schedule", "0 3 * * *"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2
    assert "prefect server start" in result.stderr and "PREFECT_API_URL" in result.stderr


def test_flags_are_overrides_of_their_config_field_and_win():
    """`--log-dir` is the flywheel's and monitor's `logs_dir`; demo's `--k`, `--min-path-prob`, `--dtype`
    are its fields of those names. They follow the `--set` overrides, so they win (and a scheduled
    deployment gets them with the rest)."""
    from draftwheel.flows.commands import build_parser
    from draftwheel.cli_help import flag_overrides
    from draftwheel.config import load_config
    from draftwheel.flows.cli import FLAG_FIELDS
    from draftwheel.flows.demo import DemoConfig
    from draftwheel.flows.monitor import MonitorConfig

    parser = build_parser()
    args = parser.parse_args(["monitor", "--set", "logs_dir=/a", "--log-dir", "/b", "run_flywheel=false"])
    assert flag_overrides(args, FLAG_FIELDS) == ["logs_dir=/a", "run_flywheel=false", "logs_dir=/b"]
    assert load_config(MonitorConfig, None, flag_overrides(args, FLAG_FIELDS)).logs_dir == "/b"
    assert flag_overrides(parser.parse_args(["flywheel", "--log-dir", "/c"]), FLAG_FIELDS) == ["logs_dir=/c"]
    args = parser.parse_args(["demo", "--config", "configs/demo.yaml", "--set", "k=6", "--k", "3",
                              "--min-path-prob", "0.1", "--dtype", "float32"])
    demo = load_config(DemoConfig, args.config, flag_overrides(args, FLAG_FIELDS))
    assert (demo.k, demo.min_path_prob, demo.dtype) == (3, 0.1, "float32")
    assert flag_overrides(parser.parse_args(["demo"]), FLAG_FIELDS) == []  # no flag: the config's values


def test_a_flag_the_config_refuses_names_the_field(capsys):
    assert main(["demo", "--k", "0"]) == 2
    assert " k" in capsys.readouterr().err
