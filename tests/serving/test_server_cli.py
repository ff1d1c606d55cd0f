"""`draftwheel serve`: config precedence and validation, the draft watcher, and the real command end to end."""

from __future__ import annotations

import argparse
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

from draftwheel.config import ConfigError, load_config
from serving.engine import Engine
from serving.records import parse_record
from serving.server import ServeConfig, background_server, create_app
from serving.server_cli import API_KEY_ENV, DEFAULT_CONFIG, _start_watcher, build_config, register
from serving.sink import iter_lines
from tests.serving.test_server import model_dirs  # noqa: F401 - a fixture


def _serve_args(*argv: str):
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_configs_serve_yaml_matches_serve_config_defaults():
    assert load_config(ServeConfig, DEFAULT_CONFIG) == ServeConfig()


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
])
def test_bad_serve_settings_raise_config_errors_naming_the_field(argv, needle):
    with pytest.raises(ConfigError, match=needle):
        build_config(_serve_args(*argv))


def test_draftwheel_serve_end_to_end(model_dirs, tmp_path):
    """The real command in a subprocess: serve, answer with a key, shut down on SIGINT, leave the log fsynced."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = {**os.environ, "DRAFTWHEEL_HOME": str(tmp_path / "home"), "DRAFTWHEEL_API_KEY": "k3y",
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "draftwheel", "serve", "--target", str(model_dirs[0]), "--draft", str(model_dirs[1]),
         "--port", str(port)], cwd=Path(__file__).resolve().parents[2], env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.stdout.read()
            try:
                health = httpx.get(url + "/healthz").json()
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server did not come up"
                time.sleep(0.2)
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
    engine = Engine.from_paths(*model_dirs)
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
