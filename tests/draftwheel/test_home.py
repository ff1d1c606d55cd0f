"""The user's Prefect configuration wins over draftwheel's embedded Prefect home.

`draftwheel.home.apply_offline_defaults` puts PREFECT_HOME under the state dir only when the user has no
Prefect configuration of their own; otherwise it sets no PREFECT_ variable at all (an environment variable
would override their profile). Checked on the decision itself, on the environment it leaves, and through
Prefect's own settings in a fresh process, with a profiles file written by Prefect's own CLI.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from draftwheel import home
from draftwheel.home import OFFLINE_ENV, PREFECT_USER_ENV, apply_offline_defaults, user_prefect_config

PREFECT_CLI = [sys.executable, "-m", "prefect"]
SHOW_SETTINGS = ("from draftwheel.home import apply_offline_defaults; apply_offline_defaults(); "
                 "import os; from prefect.settings import get_current_settings; s = get_current_settings(); "
                 "print(s.home); print(s.api.url); print(os.environ.get('PREFECT_HOME', '-'))")


def bare_env(tmp_path: Path) -> dict[str, str]:
    """An environment with no Prefect configuration: no PREFECT_ variable, HOME an empty dir, a fresh state dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    (tmp_path / "user").mkdir(exist_ok=True)
    return {**env, "HOME": str(tmp_path / "user"), "DRAFTWHEEL_HOME": str(tmp_path / "state")}


def profiles(user_home: Path, text: str) -> Path:
    path = user_home / ".prefect" / "profiles.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_no_configuration_is_found_where_there_is_none(tmp_path):
    assert user_prefect_config({}, tmp_path, tmp_path) == ""
    # Prefect's own default: the ephemeral profile active, with its one shipped setting.
    profiles(tmp_path, 'active = "ephemeral"\n[profiles.ephemeral]\nPREFECT_SERVER_EPHEMERAL_ENABLED = "true"\n')
    assert user_prefect_config({}, tmp_path, tmp_path) == ""
    (tmp_path / "pyproject.toml").write_text("[tool.black]\nline-length = 100\n")
    (tmp_path / ".env").write_text("HF_HOME=/x\n")
    assert user_prefect_config({}, tmp_path, tmp_path) == ""


@pytest.mark.parametrize("name", PREFECT_USER_ENV)
def test_a_prefect_variable_is_the_users_configuration(tmp_path, name):
    assert user_prefect_config({name: "x"}, tmp_path, tmp_path) == f"${name}"
    assert user_prefect_config({name: ""}, tmp_path, tmp_path) == ""  # set but empty: nothing


@pytest.mark.parametrize("text, found", [
    ('active = "ephemeral"\n[profiles.ephemeral]\nPREFECT_API_URL = "http://prefect:4200/api"\n',
     "profile 'ephemeral' sets PREFECT_API_URL"),
    ('active = "local"\n', "active profile 'local'"),
    ('active = "ephemeral"\n[profiles.cloud]\nPREFECT_API_KEY = "pnu_x"\n', "profile 'cloud' sets PREFECT_API_KEY"),
    ('active = "ephemeral"\n[profiles.ephemeral]\nPREFECT_SERVER_EPHEMERAL_ENABLED = "false"\n',
     "profile 'ephemeral' sets PREFECT_SERVER_EPHEMERAL_ENABLED"),
    ("active = [unterminated\n", "unreadable"),
])
def test_a_profiles_file_of_the_users_own_is_their_configuration(tmp_path, text, found):
    path = profiles(tmp_path, text)
    assert user_prefect_config({}, tmp_path, tmp_path).startswith(str(path))
    assert found in user_prefect_config({}, tmp_path, tmp_path)


@pytest.mark.parametrize("name, text", [("prefect.toml", "[api]\nurl = 'http://x/api'\n"),
                                        (".prefect.toml", "home = '/x'\n"),
                                        ("pyproject.toml", "[tool.prefect.api]\nurl = 'http://x/api'\n"),
                                        (".env", "export PREFECT_API_URL=http://x/api\n")])
def test_prefect_settings_in_the_working_directory_are_the_users_configuration(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    assert user_prefect_config({}, tmp_path / "nohome", tmp_path).startswith(str(tmp_path / name))


@pytest.fixture
def clean_env(tmp_path, monkeypatch):
    """No Prefect variable, HOME an empty dir, a fresh state dir; everything restored afterwards."""
    for key in [*OFFLINE_ENV, *PREFECT_USER_ENV]:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "user"))
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    return monkeypatch


def test_without_user_configuration_prefect_lives_in_the_state_dir(clean_env, tmp_path):
    apply_offline_defaults()
    assert os.environ["PREFECT_HOME"] == str(tmp_path / "state" / "prefect") == str(home.prefect_home())
    assert os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "120"


@pytest.mark.parametrize("name, value", [("PREFECT_API_URL", "http://prefect.internal:4200/api"),
                                         ("PREFECT_HOME", "/srv/their-prefect")])
def test_a_users_prefect_variable_is_never_overridden(clean_env, name, value):
    clean_env.setenv(name, value)
    before = {k: v for k, v in os.environ.items() if k.startswith("PREFECT_")}
    apply_offline_defaults()
    # Nor any other Prefect setting: an environment variable would override the user's profile.
    assert {k: v for k, v in os.environ.items() if k.startswith("PREFECT_")} == before
    assert os.environ[name] == value and (name == "PREFECT_HOME" or "PREFECT_HOME" not in os.environ)
    assert os.environ["HF_HUB_OFFLINE"] == "1"  # the other offline defaults still apply


def test_prefect_itself_sees_the_embedded_home_only_without_user_configuration(tmp_path):
    """Through Prefect's own settings, in fresh processes: first with nothing configured (the state dir's
    home), then after `prefect config set PREFECT_API_URL=...` wrote the user's profiles file (their
    ~/.prefect home and their server URL, PREFECT_HOME left unset)."""
    env = bare_env(tmp_path)
    shown = subprocess.run([sys.executable, "-c", SHOW_SETTINGS], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == [str(tmp_path / "state" / "prefect"), "None", str(tmp_path / "state" / "prefect")]

    url = "http://prefect.example:4200/api"
    configured = subprocess.run([*PREFECT_CLI, "config", "set", f"PREFECT_API_URL={url}"], env=env, cwd=tmp_path,
                                capture_output=True, text=True, timeout=120)
    assert configured.returncode == 0, configured.stderr
    assert (tmp_path / "user" / ".prefect" / "profiles.toml").is_file()
    shown = subprocess.run([sys.executable, "-c", SHOW_SETTINGS], env=env, cwd=tmp_path, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.split() == [str(tmp_path / "user" / ".prefect"), url, "-"]
