"""The state directory and the offline defaults of the embedded stack.

Everything the embedded defaults write goes under one directory: `$DRAFTWHEEL_HOME`, default
`./.draftwheel` (models/, logs/, datasets/, mlflow.db, mlartifacts/, prefect/). This module only
computes paths and sets environment defaults; it starts nothing. Paths are computed from the current
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


def apply_offline_defaults() -> Path:
    """Set the offline environment defaults and Prefect's home under the state dir; return the state dir."""
    home = state_dir()
    for key, value in OFFLINE_ENV.items():
        os.environ.setdefault(key, value)
    # Prefect refuses to start if PREFECT_HOME's parent does not exist.
    home.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    return home
