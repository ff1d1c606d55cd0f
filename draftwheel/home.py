"""The state directory and the offline defaults of the embedded stack.

Everything the embedded defaults write goes under one directory: `$DRAFTWHEEL_HOME`, default
`./.draftwheel` (models/, logs/, datasets/, mlflow.db, mlartifacts/, prefect/). This module only
computes paths and sets environment defaults; it starts nothing. Prefect's home goes under the state dir
only as a fallback: a user who configured Prefect (`user_prefect_config`) keeps their own profile, server
URL and cloud login. Paths are computed from the current
state dir on every call, so a moved or copied state dir is used where it is (the absolute paths MLflow
recorded follow it: `draftwheel.store_root`).

The default paths that connect the stages are defined here and nowhere else: `draftwheel traffic` writes
`logs_dir()`, `draftwheel mine` reads it and writes `mined_dir()`, the trainers read
`mined_dataset("distill" | "preference")` and `draftwheel shadow` reads `mined_dataset("holdout")`.
The flywheel lays out each run's `datasets/` the same way (`mined_dataset(kind, root)`).
"""

from __future__ import annotations

import os
import time
import tomllib
from pathlib import Path
from typing import Mapping

# Settings that keep the embedded stack working on a machine with no internet. `setdefault` so that a
# user's own environment (a real Prefect server, a remote MLflow) always wins.
OFFLINE_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "DO_NOT_TRACK": "1",
}


def state_dir() -> Path:
    """The state directory, absolute (not created)."""
    return Path(os.environ.get("DRAFTWHEEL_HOME", ".draftwheel")).resolve()


def models_dir() -> Path:
    return state_dir() / "models"


def logs_dir() -> Path:
    return state_dir() / "logs"


def datasets_dir() -> Path:
    return state_dir() / "datasets"


DATASET_KINDS = ("distill", "preference", "holdout")
"""The datasets `mine` writes (one dir each, beside manifest.json)."""


def mined_dir() -> Path:
    """Where `draftwheel mine` writes by default, and so where the trainers and `shadow` read."""
    return datasets_dir()


def mined_dataset(kind: str, root: str | Path | None = None) -> Path:
    """The `kind` dataset of a mined root (default `mined_dir()`)."""
    if kind not in DATASET_KINDS:
        raise ValueError(f"dataset kind: {kind!r} is not one of {', '.join(DATASET_KINDS)}")
    return Path(root if root is not None else mined_dir()) / kind


def timestamped_dir(name: str, root: str | Path | None = None) -> Path:
    """A new dir `<root>/<UTC time>[.N]`, created (root default: `<state dir>/<name>`); two calls never share one."""
    parent = Path(root) if root else state_dir() / name
    path = parent / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    stem, suffix = path.name, 0
    while True:
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            suffix += 1
            path = path.with_name(f"{stem}.{suffix}")


def tracking_uri() -> str:
    """MLflow tracking URI: `$MLFLOW_TRACKING_URI` if set, else sqlite in the state dir."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{state_dir() / 'mlflow.db'}"


ARTIFACTS_DIR = "mlartifacts"
"""The embedded MLflow store's artifact root, a dir of the state dir; its one definition."""


def artifacts_uri() -> str:
    """`file://<state dir>/mlartifacts`: where the embedded store keeps run artifacts and registered versions."""
    return (state_dir() / ARTIFACTS_DIR).as_uri()


PREFECT_USER_ENV = ("PREFECT_HOME", "PREFECT_PROFILES_PATH", "PREFECT_PROFILE", "PREFECT_API_URL", "PREFECT_API_KEY")
"""Environment variables that say the user runs Prefect their own way."""
PREFECT_FILES = ("prefect.toml", ".prefect.toml")
"""Settings files Prefect reads from the working directory (besides pyproject.toml's [tool.prefect] and .env)."""
# The one setting of the profile Prefect activates when nobody chose one (its shipped profiles.toml).
_DEFAULT_PROFILE, _DEFAULT_SETTINGS = "ephemeral", {"PREFECT_SERVER_EPHEMERAL_ENABLED": "true"}


def user_prefect_config(environ: Mapping[str, str] | None = None, user_home: Path | None = None,
                        cwd: Path | None = None) -> str:
    """Where the user's own Prefect configuration is, in a few words; "" when there is none: no
    `PREFECT_USER_ENV` variable set, no profiles file (`~/.prefect/profiles.toml`) that activates a profile
    other than Prefect's default one or gives any profile a setting of its own (`prefect config set`,
    `prefect cloud login`, `prefect profile use`), and no Prefect settings in the working directory. Reads
    files only; never imports Prefect (it runs before every command)."""
    environ = os.environ if environ is None else environ
    user_home = Path.home() if user_home is None else user_home
    cwd = Path.cwd() if cwd is None else cwd
    for name in PREFECT_USER_ENV:
        if environ.get(name):
            return f"${name}"
    profiles = user_home / ".prefect" / "profiles.toml"
    if profiles.is_file():
        try:
            contents = tomllib.loads(profiles.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            return f"{profiles} (unreadable: left to Prefect)"
        active = contents.get("active") or _DEFAULT_PROFILE
        if active != _DEFAULT_PROFILE:
            return f"{profiles} (active profile {active!r})"
        for name, settings in (contents.get("profiles") or {}).items():
            own = sorted(k for k, v in (settings or {}).items()
                         if name != _DEFAULT_PROFILE or str(v).lower() != _DEFAULT_SETTINGS.get(k))
            if own:
                return f"{profiles} (profile {name!r} sets {', '.join(own)})"
    for name in PREFECT_FILES:
        if (cwd / name).is_file():
            return str(cwd / name)
    pyproject, dotenv = cwd / "pyproject.toml", cwd / ".env"
    try:
        if pyproject.is_file() and "prefect" in tomllib.loads(pyproject.read_text()).get("tool", {}):
            return f"{pyproject} [tool.prefect]"
        if dotenv.is_file() and any(line.strip().removeprefix("export ").startswith("PREFECT_")
                                    for line in dotenv.read_text().splitlines()):
            return f"{dotenv} (PREFECT_ variables)"
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        pass  # a file Prefect cannot read either: it configures nothing
    return ""


def prefect_home() -> Path:
    """The embedded Prefect home: `<state dir>/prefect`, used only when `user_prefect_config()` finds nothing."""
    return state_dir() / "prefect"


def apply_offline_defaults() -> Path:
    """Set the offline environment defaults; return the state dir. Prefect's settings (its home, under the
    state dir, and the embedded server's start-up limits) are set only when the user has no Prefect
    configuration of their own (`user_prefect_config`): an environment variable would override their profile."""
    home = state_dir()
    own_prefect = bool(user_prefect_config())
    for key, value in OFFLINE_ENV.items():
        if not (own_prefect and key.startswith("PREFECT_")):
            os.environ.setdefault(key, value)
    # Prefect refuses to start if PREFECT_HOME's parent does not exist.
    home.mkdir(parents=True, exist_ok=True)
    if not own_prefect:
        os.environ["PREFECT_HOME"] = str(prefect_home())
    return home
