"""The flow commands' argument handling, in a subprocess (no Prefect server is started by these)."""

from __future__ import annotations

import os
import subprocess
import sys


def draftwheel(*args, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["DRAFTWHEEL_HOME"] = str(tmp_path / "home")
    return subprocess.run([sys.executable, "-m", "draftwheel", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_bad_config_fails_fast_with_the_field_named(tmp_path):
    result = draftwheel("flywheel", "trainer=magic", tmp_path=tmp_path)
    assert result.returncode == 2 and "trainer" in result.stderr
    result = draftwheel("monitor", "min_acceptance=7", tmp_path=tmp_path)
    assert result.returncode == 2 and "min_acceptance" in result.stderr


def test_schedule_without_a_prefect_server_explains_what_to_start(tmp_path):
    result = draftwheel("flywheel", "--schedule", "0 3 * * *", tmp_path=tmp_path)
    assert result.returncode == 2
    assert "prefect server start" in result.stderr and "PREFECT_API_URL" in result.stderr
