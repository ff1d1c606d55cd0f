"""The state directory and the offline defaults of the embedded stack.

Everything the embedded defaults write goes under one directory: `$DRAFTWHEEL_HOME`, default
`./.draftwheel` (models/, logs/, datasets/, mlflow.db, mlartifacts/, prefect/). This module only
computes paths and sets environment defaults; it starts nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

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


def tracking_uri() -> str:
    """MLflow tracking URI: `$MLFLOW_TRACKING_URI` if set, else sqlite in the state dir."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{state_dir() / 'mlflow.db'}"


def artifacts_uri() -> str:
    return (state_dir() / "mlartifacts").as_uri()


def apply_offline_defaults() -> Path:
    """Set the offline environment defaults and Prefect's home under the state dir; return the state dir."""
    home = state_dir()
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    # Prefect refuses to start if PREFECT_HOME's parent does not exist.
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    return home
