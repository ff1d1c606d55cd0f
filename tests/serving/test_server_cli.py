"""`draftwheel serve`: config precedence and validation, the draft watcher, and the real command end to end."""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import openai
import pytest
import yaml

from draftwheel.config import ConfigError, load_config
from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.engine.records import parse_record
from draftwheel.serving.server.app import ServeConfig, background_server, create_app
from draftwheel.flows.commands import main
from draftwheel.serving.server.cli import API_KEY_ENV, DEFAULT_CONFIG, _start_watcher, build_config, register
from draftwheel.serving.engine.sink import iter_lines
from tests.serving.test_server import model_dirs  # noqa: F401 - a fixture


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_health(proc: subprocess.Popen, port: int, timeout_s: float = 120) -> str:
    """The base URL once the served /healthz answers; fails with the output if the process died."""
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None, proc.stdout.read()
        try:
            httpx.get(url + "/healthz")
            return url
        except httpx.TransportError:
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)


def _serve_args(*argv: str):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_configs_serve_yaml_matches_serve_config_defaults():
    assert load_config(ServeConfig, DEFAULT_CONFIG) == ServeConfig()
    written = set(yaml.safe_load(DEFAULT_CONFIG.read_text()))
    assert written == {f.name for f in dataclasses.fields(ServeConfig)}  # every setting documented there


def test_cli_flags_override_set_which_overrides_the_yaml(monkeypatch, tmp_path):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    config_file = tmp_path / "serve.yaml"
    config_file.write_text("k: 3\nport: 9000\nlog_compress: true\n")
    config = build_config(_serve_args("--config", str(config_file), "--set", "k=6", "--port", "9001",
                                      "--target", "/m/t", "--no-draft", "--log-dir", "/l"))
    assert (config.k, config.port, config.target, config.draft, config.log_dir) == (6, 9001, "/m/t", None, "/l")
    assert config.log_compress is True and config.api_key is None
    assert build_config(_serve_args()).draft == "models:/draftwheel-draft@champion"


def test_api_key_comes_from_flag_then_config_then_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(API_KEY_ENV, "from-env")
    assert build_config(_serve_args()).api_key == "from-env"
    assert build_config(_serve_args("--set", "api_key=from-config")).api_key == "from-config"
    assert build_config(_serve_args("--api-key", "from-flag")).api_key == "from-flag"


@pytest.mark.parametrize(("argv", "needle"), [
    (["--set", "k=0"], "k"),
    (["--port", "70000"], "port"),
    (["--set", "colour=blue"], "colour"),
    (["--set", "default_temperature=-1"], "default_temperature"),
    (["--set", "api_key="], "api_key"),
    (["--api-key", ""], "api_key"),  # `--api-key "$KEY"` with KEY unset must not open the server
    (["--api-key", "  "], "api_key"),
    (["--set", "max_body_bytes=0"], "max_body_bytes"),
    (["--set", "drain_timeout_s=-1"], "drain_timeout_s"),
])
def test_bad_serve_settings_raise_config_errors_naming_the_field(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        build_config(_serve_args(*argv))


def test_an_empty_api_key_in_the_environment_is_refused_too(monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "")
    with pytest.raises(ConfigError, match="api_key"):
        build_config(_serve_args())


def _serve_main(capsys, *argv: str) -> tuple[int, str]:
    """`draftwheel serve ARGV` in process, for the failures before the server starts: (exit code, stderr)."""
    code = main(["serve", *argv])
    return code, capsys.readouterr().err


def _one_line(err: str) -> str:
    """The one error line (model loading may print progress bars and library INFO lines before it)."""
    lines = [line for line in err.splitlines() if line.startswith("draftwheel")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_an_unwritable_log_dir_stops_serve_before_loading_models(capsys, tmp_path):
    blocked = tmp_path / "logs"
    (blocked / "acceptance.jsonl").mkdir(parents=True)  # the active log cannot be opened, even by root
    code, err = _serve_main(capsys, "--target", "/never/loaded", "--log-dir", str(blocked))
    assert code == 2 and "log_dir" in _one_line(err) and str(blocked) in err
    not_creatable = tmp_path / "a-file"
    not_creatable.write_text("")
    code, err = _serve_main(capsys, "--target", "/never/loaded", "--log-dir", str(not_creatable / "logs"))
    assert code == 2 and "log_dir" in _one_line(err) and "a-file/logs" in err


def test_a_missing_log_dir_is_created(tmp_path):
    config = ServeConfig(log_dir=str(tmp_path / "new" / "logs"))
    from draftwheel.serving.server.cli import open_sink

    open_sink(config).close()
    assert (tmp_path / "new" / "logs").is_dir()


@pytest.fixture
def registry_home(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "home"


def test_models_that_cannot_be_loaded_are_one_line_errors(capsys, registry_home, model_dirs):
    from draftwheel import tracking

    code, err = _serve_main(capsys, "--target", "/nonexistent", "--no-draft")
    assert code == 2 and "target" in _one_line(err) and "/nonexistent" in err
    target = str(model_dirs[0])
    code, err = _serve_main(capsys, "--target", target, "--draft", "models:/nosuch@champion")
    assert code == 2 and "draft" in _one_line(err) and "models:/nosuch@champion" in err
    version = tracking.register_draft(model_dirs[1])
    tracking.set_alias(version, "champion")
    for weights in registry_home.rglob("*.safetensors"):  # the registry's copies, not model_dirs
        weights.unlink()
    code, err = _serve_main(capsys, "--target", target, "--draft", "models:/draftwheel-draft@champion")
    assert code == 2 and "models:/draftwheel-draft@champion" in _one_line(err)


def test_draftwheel_serve_end_to_end(model_dirs, tmp_path):
    """The real command in a subprocess: serve, answer with a key, shut down on SIGINT, leave the log fsynced."""
    port = _free_port()
    env = {**os.environ, "DRAFTWHEEL_HOME": str(tmp_path / "home"), "DRAFTWHEEL_API_KEY": "k3y",
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "draftwheel.flows.commands", "serve", "--target", str(model_dirs[0]), "--draft", str(model_dirs[1]),
         "--port", str(port)], cwd=Path(__file__).resolve().parents[2], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = _wait_for_health(proc, port)
        health = httpx.get(url + "/healthz").json()
        assert health["draft"]["name"] == "draft"
        client = openai.OpenAI(base_url=url + "/v1", api_key="k3y", max_retries=0)
        text = client.completions.create(model="target", prompt="To be, or", max_tokens=5, temperature=0,
                                         extra_body={"slice": "e2e"}).choices[0].text
    finally:
        proc.send_signal(signal.SIGINT)
        output = proc.communicate(timeout=60)[0]
    assert proc.returncode == 0, output
    records = [parse_record(line) for *_, line in iter_lines(tmp_path / "home" / "logs")]
    assert [(r.slice, r.output) for r in records] == [("e2e", text)]


def test_registry_draft_starts_a_watcher_reported_on_healthz(model_dirs):
    engine = engine_from_specs(*model_dirs)
    assert _start_watcher(engine, ServeConfig(draft="/some/dir")) is None
    watcher = _start_watcher(engine, ServeConfig(draft="models:/draftwheel-draft@champion", reload_poll_s=3600))
    try:
        assert watcher._thread.is_alive() and watcher.alias == "champion"
        with background_server(create_app(engine, ServeConfig(served_model_name="tiny"), watcher)) as url:
            reload = httpx.get(url + "/healthz").json()["reload"]
        assert reload == {"uri": "models:/draftwheel-draft@champion", "current_version": "", "swaps": 0,
                          "last_error": None}
    finally:
        watcher.stop()
    assert watcher._thread is None


def test_sigterm_drain_timeout_cuts_a_long_request_and_says_so(model_dirs, tmp_path):
    """A streaming request that would run ~1000 tokens, SIGTERM, `drain_timeout_s=0.5`: the server stops
    within seconds, says one request was cut, and exits 0 (through the code that closes the log).

    The time bound holds because the cut engine job stops at its next step: this prompt's output turns into
    incomplete UTF-8 characters after ~14 deltas, so a job that looked at its cancel flag only between
    deltas ran on to 1000 tokens and the interpreter's exit waited for its thread (~27 s under load; the
    engine side is tested in test_engine). The exit takes ~1.5 s on a busy 2-core machine."""
    port = _free_port()
    env = {**os.environ, "DRAFTWHEEL_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
    env.pop(API_KEY_ENV, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "draftwheel.flows.commands", "serve", "--target", str(model_dirs[0]), "--no-draft",
         "--port", str(port), "--set", "drain_timeout_s=0.5"], cwd=Path(__file__).resolve().parents[2], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = _wait_for_health(proc, port)
        body = {"model": "target", "prompt": "The quick brown", "max_tokens": 1000, "temperature": 0, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
            lines = response.iter_lines()
            next(lines)
            proc.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            events = []
            with pytest.raises(httpx.RemoteProtocolError):  # cut: the chunked body never ends
                events.extend(lines)
            output = proc.communicate(timeout=60)[0]
            stopped = time.monotonic() - signalled
    finally:
        proc.kill()
    assert stopped < 8, f"{stopped:.1f} s from SIGTERM to exit\n{output}"
    assert proc.returncode == 0, output  # 0: not killed by the signal, so the log was closed
    assert not any('"finish_reason": "length"' in e for e in events), "the request was not cut"
    assert "1 request(s) in flight were cut" in output, output


def test_an_alias_bomb_in_host_is_one_line_naming_the_file(capsys, alias_bomb, tmp_path):
    """`host:` holding 9**9 strings once expanded: refused from the token stream, before any model or log."""
    bomb = alias_bomb("host")
    code, err = _serve_main(capsys, "--config", str(bomb), "--target", "/never/loaded",
                            "--log-dir", str(tmp_path / "logs"))
    line = _one_line(err)
    assert code == 2 and str(bomb) in line and "anchors and aliases" in line
    assert not (tmp_path / "logs").exists()


def test_a_pickle_draft_stops_serve_in_one_line(capsys, pickle_draft, model_dirs, tmp_path):
    """serve with a draft dir holding only a crafted `pytorch_model.bin`: exit 2, one line naming the draft,
    and the pickle's code never runs."""
    evil, marker = pickle_draft
    code, err = _serve_main(capsys, "--target", str(model_dirs[0]), "--draft", str(evil),
                            "--log-dir", str(tmp_path / "logs"))
    line = _one_line(err)
    assert code == 2 and f"draft {evil}" in line and "no .safetensors weights" in line and not marker.exists()
