"""The one module that talks to MLflow: experiment tracking and the model registry.

Tracking: `get_tracker(enabled)` returns an `MlflowTracker` (sqlite + local artifacts in the state dir
by default, any `MLFLOW_TRACKING_URI` otherwise) or a `NullTracker` that does nothing, so stage code
never checks whether tracking is on. A state dir moved or copied elsewhere has its own sqlite store
re-rooted to it when first opened there (`draftwheel.store_root`), so a copy reads and writes its own files.

Registry primitives (register, aliases, resolve `models:/NAME@ALIAS` to a local safetensors dir) live
below the trackers. They check files, not policy: a version enters the registry and becomes champion only
through `draftwheel.registry` (`register_version`, `promote`). A version is an MLflow model: a pyfunc flavor
whose loader (`draftwheel.serving.draft_pyfunc`, named here, never imported) drafts for a context, with a
signature and an input example, around the files serving loads (`registry_names.FILES_DIR`). Versions
registered before that are those files alone; `resolve_model_uri` reads both. Nothing else in the project
imports `mlflow`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import sqlite3
import tempfile
from pathlib import Path, PurePosixPath
from typing import Any, Iterator

from draftwheel import home, store_root
from draftwheel.hashing import file_sha256, weights_sha256
from draftwheel.registry_names import (  # noqa: F401 - DRAFT_MODEL, ALIASES, WEIGHTS_TAG: re-exported
    ALIASES, DRAFT_KIND_TAG, DRAFT_MODEL, FILES_DIR, FILES_DIR_TAG, FILES_TAG, PREDICT_INPUTS, PREDICT_OUTPUTS,
    PYFUNC_LOADER, TARGET_DIR_TAG, TARGET_HUB_TAG, TARGET_SHA_TAG, URI_PREFIX, WEIGHTS_TAG)

EXPERIMENT = "draftwheel"
log = logging.getLogger(__name__)


_NOT_IN_METRIC_KEYS = re.compile(r"[^/\w.\- :]")


def metric_key(name: str) -> str:
    """`name` as MLflow takes a metric key: a character it refuses (anything but letters, digits, `_`,
    `-`, `.`, `:`, space and `/`) becomes `_`, and so does a path part that is empty, `.` or `..`. Keys
    carry names from served traffic (a request's slice is any string a client sends), and one such name
    must not fail a run; two names that differ only there share a key."""
    parts = _NOT_IN_METRIC_KEYS.sub("_", name).split("/")
    return "/".join("_" if part in ("", ".", "..") else part for part in parts)


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
        self._mlflow.log_metrics({metric_key(k): float(v) for k, v in metrics.items()}, step=step)

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


def _open_store(uri: str) -> None:
    """Ready a store before MLflow opens it: a sqlite file's dir is created, and the state dir's own sqlite
    store, when the state dir was moved or copied, is re-rooted here (`draftwheel.store_root`), so its runs
    and versions read and write this state dir's `mlartifacts/`. Any other store is left as it is."""
    if not uri.startswith("sqlite:///"):
        return
    db = Path(uri[len("sqlite:///"):])
    db.parent.mkdir(parents=True, exist_ok=True)
    if not db.resolve().is_relative_to(home.state_dir()):
        return
    try:
        moved = store_root.reroot(db, EXPERIMENT, home.artifacts_uri())
    except sqlite3.Error as exc:
        raise RegistryError(f"registry: {db}: re-rooting its artifact locations to {home.artifacts_uri()} "
                            f"(a moved or copied state dir) failed: {' '.join(str(exc).split())}") from exc
    if moved is not None:
        log.warning("state dir moved or copied: %s now keeps its artifacts under %s, not %s (%d rows re-rooted)",
                    db, moved.new, " or ".join(moved.old), moved.rows)


def _artifact_location() -> str | None:
    uri = home.tracking_uri()
    # Only the embedded sqlite default gets the state-dir artifact store; a remote server keeps its own.
    return home.artifacts_uri() if uri.startswith("sqlite:") else None


def setup_mlflow(tracking_uri: str | None = None) -> str:
    """Point MLflow at `tracking_uri` (default: the state dir's sqlite) and return it."""
    import mlflow

    uri = tracking_uri or home.tracking_uri()
    _open_store(uri)
    # MLflow exports the URIs to os.environ (for subprocesses); undo that so the state dir stays the
    # default for the next call (a later test, or a DRAFTWHEEL_HOME change) and a user's own setting wins.
    saved = {key: os.environ.get(key) for key in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    return uri


def get_tracker(enabled: bool = True, tracking_uri: str | None = None) -> NullTracker:
    """An MLflow tracker when enabled, else a do-nothing one."""
    return MlflowTracker(tracking_uri) if enabled else NullTracker()


# ---------------------------------------------------------------------------------------------------
# Model registry
# ---------------------------------------------------------------------------------------------------

# Files a draft model dir may carry into the registry. Weights must be safetensors; everything else is
# JSON/text config and tokenizer files. Pickle-based formats are never stored nor loaded.
ALLOWED_SUFFIXES = (".safetensors", ".json", ".txt", ".jinja")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".npy", ".joblib")


class RegistryError(RuntimeError):
    """The registry is unreachable, or a model, version or alias does not exist."""


class ArtifactError(RegistryError):
    """A version's files are missing, corrupt, or not safetensors; nothing from it may be loaded."""


@contextlib.contextmanager
def _registry_call(what: str) -> Iterator[None]:
    """Turn MLflow/transport failures into `RegistryError` naming what was being done."""
    import requests
    from mlflow.exceptions import MlflowException

    try:
        yield
    except RegistryError:
        raise
    except (MlflowException, OSError, requests.RequestException) as exc:
        detail = " ".join(str(exc).split())[:500]  # one line: MLflow's messages span several
        raise RegistryError(f"registry: {what} failed: {detail}") from exc


def _client(tracking_uri: str | None):
    from mlflow import MlflowClient

    uri = tracking_uri or home.tracking_uri()
    _open_store(uri)
    with _registry_call(f"connecting to {uri}"):
        return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _model_files(model_dir: Path) -> list[Path]:
    """The registrable files of a model dir; refuses a dir with no safetensors weights."""
    if not model_dir.is_dir():
        raise ArtifactError(f"{model_dir}: not a directory")
    files = sorted(p for p in model_dir.iterdir() if p.is_file() and p.suffix in ALLOWED_SUFFIXES)
    if not any(p.suffix == ".safetensors" for p in files):
        found = ", ".join(sorted(p.name for p in model_dir.iterdir())) or "nothing"
        raise ArtifactError(f"{model_dir}: no .safetensors weights (found: {found}); pickle weights are refused")
    return files


def _tag_value(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)


def register_draft(model_dir: str | Path, tags: dict[str, Any] | None = None, name: str = DRAFT_MODEL,
                   tracking_uri: str | None = None) -> str:
    """Log a safetensors model dir as an MLflow model in a run's artifacts and create a registry version
    from it; return the version.

    The model (`_save_mlflow_model`) is a pyfunc flavor around the dir's files under `FILES_DIR`: only
    safetensors and JSON/text files (pickles in the dir are left behind). Tags (dicts become JSON strings)
    go on the version together with the sha256 of every file and where the files lie (`FILES_DIR_TAG`).
    """
    # The served draft's id carries this hash (records' draft_id.sha256), so status can be matched to logs.

    files = _model_files(Path(model_dir))
    hashes = {p.name: file_sha256(p) for p in files}
    version_tags = {k: _tag_value(v) for k, v in (tags or {}).items()}
    version_tags.update({FILES_TAG: json.dumps(hashes, sort_keys=True), WEIGHTS_TAG: weights_sha256(model_dir),
                         FILES_DIR_TAG: FILES_DIR})
    client = _client(tracking_uri)
    with _registry_call(f"registering {model_dir} as {name}"), tempfile.TemporaryDirectory() as staging:
        draft = Path(staging) / PurePosixPath(FILES_DIR).name
        draft.mkdir()
        for path in files:
            _stage(path, draft / path.name)
        model = _save_mlflow_model(Path(staging) / "model", draft, version_tags)
        run = client.create_run(_experiment_id(client), run_name=f"register-{name}",
                                tags={"draftwheel.source_dir": str(model_dir)})
        client.log_artifacts(run.info.run_id, str(model), "model")
        client.set_terminated(run.info.run_id)
        _ensure_registered_model(client, name)
        version = client.create_model_version(name, f"{run.info.artifact_uri}/model", run_id=run.info.run_id,
                                              tags=version_tags)
    return str(version.version)


def _stage(source: Path, dest: Path) -> None:
    """A file into the staging dir: a hard link where the file system allows one (MLflow copies it once
    more into the model), else a copy."""
    try:
        os.link(source, dest)
    except OSError:
        shutil.copy2(source, dest)


# The packages the pyfunc loader imports (draftwheel.serving.draft_pyfunc and what it loads models with).
PYFUNC_REQUIREMENTS = ("draftwheel", "torch", "transformers", "tokenizers", "safetensors", "pandas", "mlflow")


def _pip_requirements() -> list[str]:
    """The pyfunc model's requirements, pinned to this environment's versions. Given explicitly, so that
    MLflow does not infer them by loading the model in a subprocess (seconds on every registration)."""
    import importlib.metadata

    pinned = []
    for dist in PYFUNC_REQUIREMENTS:
        try:
            pinned.append(f"{dist}=={importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pinned.append(dist)
    return pinned


def predict_signature() -> Any:
    """The pyfunc's `ModelSignature`, from `registry_names.PREDICT_INPUTS` / `PREDICT_OUTPUTS`: every input
    column optional (a row gives a prompt or token ids), every output column present."""
    from mlflow.models import ModelSignature
    from mlflow.types.schema import Array, ColSpec, Schema

    def column(name: str, kind: str, required: bool) -> Any:
        return ColSpec(Array(kind[:-2]) if kind.endswith("[]") else kind, name, required=required)

    return ModelSignature(inputs=Schema([column(n, t, False) for n, t in PREDICT_INPUTS]),
                          outputs=Schema([column(n, t, True) for n, t in PREDICT_OUTPUTS]))


INPUT_EXAMPLE = [{"prompt": "def add(a, b):", "k": 4}]


def _save_mlflow_model(path: Path, draft: Path, tags: dict[str, str]) -> Path:
    """Write the MLflow model of a version at `path`: the MLmodel (pyfunc flavor, `PYFUNC_LOADER`, its data
    the files in `draft`, copied to `FILES_DIR`), the signature, an input example, the pinned requirements,
    and a `model_config` that `mlflow.pyfunc.load_model(..., model_config={...})` may override: `target`
    (a dir or hub id; "" = the target the version's tags record), `device`, `dtype`; the recorded target
    (`target_dir`, `target_hub_id`, `target_sha256`: the loader finds and checks the target by them). The
    model is not loaded: registering stays a copy."""
    import mlflow.pyfunc

    config = {"target": "", "device": "cpu", "dtype": "float32",
              **{tag: tags.get(tag, "") for tag in (TARGET_DIR_TAG, TARGET_HUB_TAG, TARGET_SHA_TAG)}}
    with _quiet("mlflow.pyfunc", "mlflow.models"):  # its INFO lines would break commands' one-line errors
        model = mlflow.pyfunc.save_model(
            str(path), loader_module=PYFUNC_LOADER, data_path=str(draft), signature=predict_signature(),
            input_example=INPUT_EXAMPLE, pip_requirements=_pip_requirements(), model_config=config,
            metadata={"draft_kind": tags.get(DRAFT_KIND_TAG, ""), WEIGHTS_TAG: tags.get(WEIGHTS_TAG, "")})
    data = model.flavors["python_function"].get("data")
    if data != FILES_DIR:  # serving reads the files from FILES_DIR_TAG: the two must agree
        raise RegistryError(f"registry: MLflow put the draft's files at {data!r}, not {FILES_DIR!r}")
    return path


def _experiment_id(client: Any) -> str:
    experiment = client.get_experiment_by_name(EXPERIMENT)
    if experiment is not None:
        return experiment.experiment_id
    return client.create_experiment(EXPERIMENT, artifact_location=_artifact_location())


def _ensure_registered_model(client: Any, name: str) -> None:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
    except MlflowException as exc:
        if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
            raise
        client.create_registered_model(name)


def aliases(name: str = DRAFT_MODEL, tracking_uri: str | None = None) -> dict[str, str]:
    """{alias: version} of a registered model."""
    client = _client(tracking_uri)
    with _registry_call(f"reading aliases of {name}"):
        model = client.get_registered_model(name)
    return {alias: str(version) for alias, version in model.aliases.items()}


def get_alias_version(alias: str, name: str = DRAFT_MODEL, tracking_uri: str | None = None) -> str | None:
    """The version an alias points to, or None if the alias is not set."""
    return aliases(name, tracking_uri).get(alias)


def set_alias(version: str | int, alias: str, name: str = DRAFT_MODEL, tracking_uri: str | None = None) -> None:
    move_aliases({alias: version}, name, tracking_uri)


def get_version_tags(version: str | int, name: str = DRAFT_MODEL, tracking_uri: str | None = None) -> dict[str, str]:
    client = _client(tracking_uri)
    with _registry_call(f"reading {name} version {version}"):
        return dict(client.get_model_version(name, str(version)).tags)


def set_version_tags(version: str | int, tags: dict[str, Any], name: str = DRAFT_MODEL,
                     tracking_uri: str | None = None) -> None:
    client = _client(tracking_uri)
    with _registry_call(f"tagging {name} version {version}"):
        for key, value in tags.items():
            client.set_model_version_tag(name, str(version), key, _tag_value(value))


def move_aliases(moves: dict[str, str | int | None], name: str = DRAFT_MODEL,
                 tracking_uri: str | None = None) -> dict[str, str]:
    """Set (a version) or remove (None) several aliases, all or nothing; return the new aliases.

    Every version is checked to exist before any alias moves, and a failure half-way puts the aliases
    already moved back, so a caller never sees one alias moved and the other not. Moving aliases is a
    primitive: the checked, locked promote/rollback path is `draftwheel.registry`.
    """
    unknown = sorted(set(moves) - set(ALIASES))
    if unknown:  # a typo here would silently detach serving from the promotion flow
        raise ValueError(f"alias: {unknown} not in {', '.join(ALIASES)}")
    client = _client(tracking_uri)
    with _registry_call(f"moving aliases {moves} of {name}"):
        before = {alias: str(v) for alias, v in client.get_registered_model(name).aliases.items()}
        for version in sorted({str(v) for v in moves.values() if v is not None}):
            client.get_model_version(name, version)  # a clear error before anything moves
        done: list[str] = []
        try:
            for alias, version in moves.items():
                _put_alias(client, name, alias, None if version is None else str(version), before)
                done.append(alias)
        except Exception:
            for alias in done:
                _put_alias(client, name, alias, before.get(alias), {alias: moves[alias]})
            raise
    return aliases(name, tracking_uri)


def _put_alias(client: Any, name: str, alias: str, version: str | None, current: dict[str, Any]) -> None:
    if version is not None:
        client.set_registered_model_alias(name, alias, version)
    elif current.get(alias) is not None:
        client.delete_registered_model_alias(name, alias)


def list_versions(name: str = DRAFT_MODEL, tracking_uri: str | None = None) -> list[dict[str, Any]]:
    """Every version, oldest first: version, aliases, tags, creation time, run id, source."""
    client = _client(tracking_uri)
    with _registry_call(f"listing versions of {name}"):
        versions = list(client.search_model_versions(f"name='{name}'"))
    if not versions:  # includes "no such registered model": an empty registry is not an error here
        return []
    by_version: dict[str, list[str]] = {}
    for alias, version in aliases(name, tracking_uri).items():
        by_version.setdefault(version, []).append(alias)
    rows = [{"version": str(v.version), "aliases": sorted(by_version.get(str(v.version), [])), "tags": dict(v.tags),
             "created": v.creation_timestamp / 1000.0, "run_id": v.run_id, "source": v.source} for v in versions]
    return sorted(rows, key=lambda row: int(row["version"]))


def parse_model_uri(uri: str) -> tuple[str, str | None, str | None]:
    """`models:/NAME@ALIAS` -> (NAME, None, ALIAS); `models:/NAME/VERSION` -> (NAME, VERSION, None)."""
    if not uri.startswith(URI_PREFIX):
        raise RegistryError(f"{uri!r} is not a registry URI (models:/NAME@ALIAS or models:/NAME/VERSION)")
    rest = uri[len(URI_PREFIX):].strip("/")
    if "@" in rest:
        name, alias = rest.split("@", 1)
        if name and alias:
            return name, None, alias
    elif rest.count("/") == 1 and rest.split("/")[1].isdigit():
        name, version = rest.split("/")
        return name, version, None
    raise RegistryError(f"{uri!r}: expected models:/NAME@ALIAS or models:/NAME/VERSION")


@contextlib.contextmanager
def _quiet(*names: str) -> Iterator[None]:
    """MLflow's loggers `names` at WARNING for a while (its progress notes are not ours to print)."""
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def files_uri(source: str, tags: dict[str, str]) -> str:
    """Where a version's files that serving loads lie, given its `source` and tags: `FILES_DIR_TAG` under the
    source (an MLflow model), or the source itself (a version registered before drafts were MLflow models)."""
    subdir = tags.get(FILES_DIR_TAG, "")
    if not subdir:
        return source
    if PurePosixPath(subdir).is_absolute() or ".." in PurePosixPath(subdir).parts:
        raise ArtifactError(f"{FILES_DIR_TAG} tag {subdir!r}: not a path inside the version's artifacts")
    return f"{source.rstrip('/')}/{subdir}"


def verify_model_dir(model_dir: Path, tags: dict[str, str], label: str) -> None:
    """Check a downloaded version against its `files_sha256` tag; raise `ArtifactError` on any defect."""
    if FILES_TAG not in tags:
        raise ArtifactError(f"{label}: no {FILES_TAG} tag (not registered by draftwheel); refusing to load it")
    expected: dict[str, str] = json.loads(tags[FILES_TAG])
    present = {p.name for p in model_dir.iterdir()} if model_dir.is_dir() else set()
    unsafe = sorted(n for n in present if n.endswith(PICKLE_SUFFIXES) or n not in expected)
    if unsafe:
        raise ArtifactError(f"{label}: unexpected or pickle files {unsafe}; only safetensors weights are loaded")
    if not any(n.endswith(".safetensors") for n in expected):
        raise ArtifactError(f"{label}: registered without safetensors weights; refusing to load it")
    missing = sorted(set(expected) - present)
    if missing:
        raise ArtifactError(f"{label}: artifacts missing: {missing}")
    corrupt = sorted(n for n, digest in expected.items() if file_sha256(model_dir / n) != digest)
    if corrupt:
        raise ArtifactError(f"{label}: artifacts corrupt (sha256 mismatch): {corrupt}")


def resolve_model_uri(uri: str, tracking_uri: str | None = None,
                      cache_dir: str | Path | None = None) -> tuple[Path, str, dict[str, str]]:
    """Download a registry version's files that serving loads to a verified local dir: -> (local_dir, version,
    tags). Only those files come down (`files_uri`: the MLflow model's `FILES_DIR`, or all of an older
    version's artifacts), so the dir is the same for both kinds of version.

    The cache lives under the state dir (`models/registry/NAME/VERSION`); a cached copy is re-verified
    on every call and replaced if it fails. Raises `RegistryError` (registry/alias/version problems) or
    `ArtifactError` (missing, corrupt or non-safetensors files).
    """
    import mlflow

    name, version, alias = parse_model_uri(uri)
    client = _client(tracking_uri)
    with _registry_call(f"resolving {uri}"):
        if alias is not None:
            version = get_alias_version(alias, name, tracking_uri)
            if version is None:
                raise RegistryError(f"{uri}: alias {alias!r} is not set on {name}")
        info = client.get_model_version(name, version)
        tags = dict(info.tags)
        source = files_uri(client.get_model_version_download_uri(name, version), tags)
    label = f"{name} version {version}"
    target = Path(cache_dir or home.models_dir() / "registry") / name / str(version)
    if target.is_dir():
        try:
            verify_model_dir(target, tags, label)
            return target, str(version), tags
        except ArtifactError:
            shutil.rmtree(target)  # a damaged cache: fetch it again
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as staging:
        try:
            with _registry_call(f"downloading {label}"):
                local = Path(mlflow.artifacts.download_artifacts(artifact_uri=source, dst_path=staging,
                                                                  tracking_uri=client.tracking_uri))
        except RegistryError as exc:  # the version exists, so a failed download means lost artifacts
            raise ArtifactError(f"{label}: artifacts missing or unreadable at {source}: {exc}") from exc
        verify_model_dir(local, tags, label)
        try:
            local.rename(target)  # atomic within one filesystem: readers never see a partial dir
        except OSError:
            if not target.is_dir():  # else a concurrent resolve of the same version got there first
                raise
    return target, str(version), tags
