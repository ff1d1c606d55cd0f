"""The one module that talks to MLflow: experiment tracking and the model registry.

Tracking: `get_tracker(enabled)` returns an `MlflowTracker` (sqlite + local artifacts in the state dir
by default, any `MLFLOW_TRACKING_URI` otherwise) or a `NullTracker` that does nothing, so stage code
never checks whether tracking is on.

Registry functions (register, aliases, resolve `models:/NAME@ALIAS` to a local safetensors dir) live
below the trackers. Nothing else in the project imports `mlflow`.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Iterator

from draftwheel import home

EXPERIMENT = "draftwheel"


class NullTracker:
    """Tracking switched off: every call is accepted and ignored."""

    enabled = False

    @contextlib.contextmanager
    def run(self, name: str, nested: bool = False, tags: dict[str, str] | None = None) -> Iterator[str | None]:
        yield None

    def log_params(self, params: dict[str, Any]) -> None: ...

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None: ...

    def log_figure(self, figure: Any, name: str) -> None: ...

    def log_dict(self, data: dict[str, Any], name: str) -> None: ...

    def set_tags(self, tags: dict[str, str]) -> None: ...


class MlflowTracker(NullTracker):
    """Tracks runs in MLflow. Params are flattened to strings; nested runs for flow stages."""

    enabled = True

    def __init__(self, tracking_uri: str | None = None, experiment: str = EXPERIMENT):
        import mlflow

        self._mlflow = mlflow
        setup_mlflow(tracking_uri)
        if mlflow.get_experiment_by_name(experiment) is None:
            mlflow.create_experiment(experiment, artifact_location=_artifact_location())
        mlflow.set_experiment(experiment)

    @contextlib.contextmanager
    def run(self, name: str, nested: bool = False, tags: dict[str, str] | None = None) -> Iterator[str]:
        # nested=True attaches to the active run (a flow's parent run) when there is one.
        nested = nested and self._mlflow.active_run() is not None
        with self._mlflow.start_run(run_name=name, nested=nested, tags=tags) as active:
            yield active.info.run_id

    def log_params(self, params: dict[str, Any]) -> None:
        flat = {k: (json.dumps(v) if isinstance(v, (dict, list)) else v) for k, v in params.items()}
        self._mlflow.log_params({k: str(v)[:6000] for k, v in flat.items()})

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self._mlflow.log_metrics({k: float(v) for k, v in metrics.items()}, step=step)

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        path = Path(path)
        if path.is_dir():
            self._mlflow.log_artifacts(str(path), artifact_path=artifact_path)
        else:
            self._mlflow.log_artifact(str(path), artifact_path=artifact_path)

    def log_figure(self, figure: Any, name: str) -> None:
        self._mlflow.log_figure(figure, name)

    def log_dict(self, data: dict[str, Any], name: str) -> None:
        self._mlflow.log_dict(data, name)

    def set_tags(self, tags: dict[str, str]) -> None:
        self._mlflow.set_tags(tags)


def _artifact_location() -> str | None:
    uri = home.tracking_uri()
    # Only the embedded sqlite default gets the state-dir artifact store; a remote server keeps its own.
    return home.artifacts_uri() if uri.startswith("sqlite:") else None


def setup_mlflow(tracking_uri: str | None = None) -> str:
    """Point MLflow at `tracking_uri` (default: the state dir's sqlite) and return it."""
    import mlflow

    uri = tracking_uri or home.tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    return uri


def get_tracker(enabled: bool = True, tracking_uri: str | None = None) -> NullTracker:
    """An MLflow tracker when enabled, else a do-nothing one."""
    return MlflowTracker(tracking_uri) if enabled else NullTracker()
