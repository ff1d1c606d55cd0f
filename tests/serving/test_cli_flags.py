"""The serving flags (`--k`, `--min-path-prob`, `--dtype`, `--served-model-name`, `--log-dir`) map onto the
ServeConfig fields of the same names on `serve`, and `bench` measures what `serve` runs by default
(argument handling only: no model is loaded here)."""

from __future__ import annotations


import pytest

from draftwheel.flows.commands import build_parser, main
from draftwheel.config import ConfigError
from draftwheel.evaluation.cli import bench_settings
from draftwheel.serving.server.serve_config import ServeConfig
from draftwheel.serving.server.cli import build_config


@pytest.fixture(autouse=True)
def _no_api_key(monkeypatch):
    monkeypatch.delenv("DRAFTWHEEL_API_KEY", raising=False)


def _args(*argv: str):
    return build_parser().parse_args(list(argv))


def test_serve_flags_are_the_config_fields_and_win_over_overrides():
    config = build_config(_args("serve", "--set", "k=6", "--k", "5", "--min-path-prob", "0.1", "--dtype", "bfloat16",
                                "--served-model-name", "smollm2", "--log-dir", "/tmp/logs", "router=true"))
    assert (config.k, config.min_path_prob, config.dtype) == (5, 0.1, "bfloat16")
    assert (config.served_model_name, config.log_dir, config.router) == ("smollm2", "/tmp/logs", True)
    # An unset flag leaves the file's (and the overrides') value.
    assert build_config(_args("serve", "k=6")).k == 6
    assert build_config(_args("serve")) == ServeConfig()  # configs/serve.yaml is the defaults


@pytest.mark.parametrize("argv, field", [(["--k", "0"], "k"), (["--min-path-prob", "1.5"], "min_path_prob")])
def test_a_serve_flag_the_config_refuses_names_the_field(argv, field):
    with pytest.raises(ConfigError, match=field):
        build_config(_args("serve", *argv))


def test_dtype_choices_are_the_same_on_every_command(capsys):
    for command in (["serve"], ["generate", "--prompt", "x"], ["bench", "--prompts", "p"],
                    ["traffic", "--workload", "code"], ["demo"]):
        with pytest.raises(SystemExit):
            _args(*command, "--dtype", "float16")
        assert "invalid choice: 'float16'" in capsys.readouterr().err


def test_bench_defaults_to_what_serve_runs():
    bench = bench_settings(_args("bench", "--prompts", "p.txt"))
    serve = build_config(_args("serve"))
    assert (bench.k, bench.min_path_prob, bench.dtype, bench.draft) == (serve.k, serve.min_path_prob, serve.dtype,
                                                                          serve.draft)
    assert (bench.k, bench.min_path_prob, bench.suffix_tier) == (4, 0.25, True)  # mode hybrid with the tier


def test_bench_measures_the_draft_alone_on_request():
    alone = bench_settings(_args("bench", "--prompts", "p.txt", "--no-suffix-tier", "--min-path-prob", "0"))
    assert (alone.suffix_tier, alone.min_path_prob, alone.k) == (False, 0.0, 4)
    assert not bench_settings(_args("bench", "--prompts", "p", "--set", "mode=draft")).suffix_tier  # as serve would
    assert not bench_settings(_args("bench", "--prompts", "p", "suffix_tier=false")).suffix_tier
    assert bench_settings(_args("bench", "--prompts", "p", "--suffix-tier", "mode=draft")).suffix_tier  # the flag wins
    # --no-suffix-tier with a config whose mode needs the tier: measured as the draft, not refused
    assert not bench_settings(_args("bench", "--prompts", "p", "mode=hybrid", "--no-suffix-tier")).suffix_tier


def test_bench_flags_win_and_medusa_replaces_the_draft():
    config = bench_settings(_args("bench", "--prompts", "p", "--set", "k=6", "--k", "3", "--dtype", "float32",
                                  "--draft", "d", "--target", "t"))
    assert (config.k, config.dtype, config.draft, config.target) == (3, "float32", "d", "t")
    medusa = bench_settings(_args("bench", "--prompts", "p", "--medusa", "heads"))
    assert (medusa.draft, medusa.medusa) == (None, "heads")


def test_a_bad_bench_setting_is_one_config_error_line(tmp_path, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("hi\n")
    assert main(["bench", "--prompts", str(prompts), "--k", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("draftwheel bench: config error:") and "k" in err and len(err.strip().splitlines()) == 1
    assert main(["bench", "--prompts", str(prompts), "no_such_field=1"]) == 2
    assert "no_such_field" in capsys.readouterr().err


def test_generate_keeps_its_own_defaults_and_traffic_serves_as_serve_does():
    """Flag-only commands: `generate` keeps k 4, min_path_prob 0, dtype auto; `traffic` writes serving logs,
    so it serves as `draftwheel serve` does by default (ServeConfig: k 4, min_path_prob 0.25, the suffix tier)."""
    from draftwheel.serving.server.serve_config import ServeConfig

    gen = _args("generate", "--prompt", "x")
    assert (gen.k, gen.min_path_prob, gen.dtype) == (4, 0.0, "auto")
    traffic = _args("traffic", "--workload", "code")
    serve = ServeConfig()
    assert (traffic.k, traffic.min_path_prob, traffic.suffix_tier) == (serve.k, serve.min_path_prob, serve.suffix_tier)
    assert _args("traffic", "--workload", "code", "--min-path-prob", "0.2").min_path_prob == 0.2
    assert not _args("traffic", "--workload", "code", "--no-suffix-tier").suffix_tier


def test_shadow_flags_are_its_config_fields_and_win_over_overrides():
    """`shadow` replays as serving runs: the same `--k`, `--min-path-prob`, `--dtype`, and `--log-dir` for
    the logs its suffix index is built from (ShadowConfig.suffix_logs)."""
    from draftwheel.cli_help import flag_overrides
    from draftwheel.config import load_config
    from draftwheel.flows.registry_cli import DEFAULT_CONFIG, SHADOW_FLAG_FIELDS
    from draftwheel.evaluation.gate import ShadowConfig

    args = _args("shadow", "--challenger", "d", "--set", "k=6", "--k", "5", "--min-path-prob", "0.1",
                 "--dtype", "float32", "--log-dir", "/tmp/logs", "min_requests=3")
    config = load_config(ShadowConfig, DEFAULT_CONFIG, flag_overrides(args, SHADOW_FLAG_FIELDS))
    assert (config.k, config.min_path_prob, config.dtype, config.suffix_logs) == (5, 0.1, "float32", "/tmp/logs")
    assert config.min_requests == 3
    unset = _args("shadow", "--challenger", "d", "min_requests=3")  # unset flags leave the config's values
    assert flag_overrides(unset, SHADOW_FLAG_FIELDS) == ["min_requests=3"]
