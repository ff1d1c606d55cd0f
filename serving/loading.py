"""Models and engines by any name a user gives: a local dir, a Hugging Face hub id, or a registry URI
`models:/NAME@ALIAS` (or `models:/NAME/VERSION`).

The engine loads dirs and hub ids (`draftwheel.serving.engine.models`); this module adds the registry,
through `draftwheel.tracking` (imported lazily: MLflow loads only when a registry URI is given), so the
engine itself stays free of MLflow. Everything above the engine that takes a model spec loads it here.

It also answers, in one place, which target a command serves or trains for when it is given none
(`resolve_target`): the one the draft in use was trained for, as its registry version's tags record it
(`target_tags` writes them at registration), else the reference target.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftwheel import home
from draftwheel.config import ConfigError
from draftwheel.hashing import file_sha256
from draftwheel.registry_names import (CHAMPION_URI, TARGET_DIR_TAG, TARGET_HUB_TAG, TARGET_SHA_TAG, URI_PREFIX)
from draftwheel.serving.engine import models
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.models import LoadedModel
from draftwheel.serving.engine.records import ModelId


def _registry_version(spec: str) -> tuple[Path, ModelId, dict[str, str]]:
    """A registry URI -> (its version's local dir, its id with the version, the version's tags)."""
    from draftwheel.tracking import parse_model_uri, resolve_model_uri

    local_dir, version, tags = resolve_model_uri(spec)
    return Path(local_dir), ModelId(name=parse_model_uri(spec)[0], version=str(version)), dict(tags)


def resolve_spec(spec: str | Path) -> Path:
    """The local directory a model spec (dir, hub id, models:/ URI) names."""
    if str(spec).startswith(URI_PREFIX):
        return _registry_version(str(spec))[0]
    return models.resolve_spec(spec)


def load_model(spec: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a causal LM (or an eagle3 draft) and its tokenizer from a dir, a hub id or a registry URI; a
    registry version carries its tags (the target it was trained for) into the `LoadedModel`."""
    if str(spec).startswith(URI_PREFIX):
        path, model_id, tags = _registry_version(str(spec))
        return models.load_resolved(path, str(spec), model_id, tags, device, dtype)
    return models.load_model(spec, device, dtype)


def engine_from_specs(target: str | Path, draft: str | Path | None = None, medusa: str | Path | None = None,
                      device: str = "cpu", dtype: torch.dtype = torch.float32, sink: Any = None,
                      metrics: Any = None, prepack: bool = True, **settings: Any) -> Engine:
    """Load the models and build the engine that serves them in `dtype`
    (`draftwheel.serving.engine.precision.resolve_dtype` turns a setting into one), with the engine's
    decoding `settings` (`Engine`'s min_path_prob, index_branch, runner_up)."""
    target_model = load_model(target, device, dtype)
    draft_model = load_model(draft, device, dtype) if draft is not None else None
    heads = heads_id = None
    if medusa is not None:
        from draftwheel.serving.engine.medusa import WEIGHTS_FILE, MedusaHeads

        heads = MedusaHeads.load(medusa, target_model.model).to(device=device, dtype=dtype).eval()
        heads_id = ModelId(name=Path(medusa).resolve().name, sha256=file_sha256(Path(medusa) / WEIGHTS_FILE))
    return Engine(target_model, draft_model, heads, sink=sink, metrics=metrics, medusa_id=heads_id, prepack=prepack,
                  **settings)


class TargetGoneError(ConfigError):
    """The target the draft in use was trained for is no longer where its registry version recorded it."""


def target_tags(spec: str | Path, target_sha: str, path: str | Path | None = None) -> dict[str, str]:
    """The version tags that record the target a draft was trained for: its weights hash, its dir (relative
    to the state dir when it lies inside it, so a moved or copied state dir reads its own copy) and its
    Hugging Face id where `spec` or the dir names one. `spec` is what the user gave, `path` the dir it
    loaded from (default: where `spec` resolves)."""
    from draftwheel.serving.engine.reference import hub_id

    path, state = Path(path if path is not None else resolve_spec(spec)).resolve(), home.state_dir()
    where = path.relative_to(state).as_posix() if path.is_relative_to(state) else str(path)
    hub = hub_id(spec) or hub_id(path)
    return {TARGET_SHA_TAG: target_sha, TARGET_DIR_TAG: where, **({TARGET_HUB_TAG: hub} if hub else {})}


def recorded_target(tags: dict[str, str], label: str) -> str | None:
    """The target a version's tags record, as a spec to load: its dir while it is there (the reference
    target's dir is converted again if it was deleted), else its hub id; None when the tags record no place
    (versions registered before places were recorded). Raises `TargetGoneError` when the dir is gone and no
    hub id was recorded."""
    from draftwheel.serving.engine.reference import default_target_dir, ensure_reference_target

    where, hub = tags.get(TARGET_DIR_TAG, ""), tags.get(TARGET_HUB_TAG, "")
    if not where and not hub:
        return None
    path = home.state_dir() / where if where else None  # an absolute `where` stays itself
    if path is not None and path.is_dir():
        return str(path)
    if path == default_target_dir():
        return str(ensure_reference_target(home.models_dir()))
    if hub:
        return hub
    raise TargetGoneError(f"target: {label} was trained for the target at {path} (weights "
                          f"{tags.get(TARGET_SHA_TAG, '')[:12]}), which is gone: put it back there or pass --target")


def _no_registry() -> bool:
    """True when the registry is the state dir's sqlite file and it does not exist yet (nothing registered)."""
    uri = home.tracking_uri()
    return uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).is_file()


def _version_in_use(draft: str | Path | None) -> tuple[str, dict[str, str]] | None:
    """(a label, the tags) of the registry version whose target a command follows: the one `draft` names
    when it is a `models:/` URI, else the draft model's champion; None when there is no such version."""
    uri = str(draft) if draft and str(draft).startswith(URI_PREFIX) else CHAMPION_URI
    if _no_registry():
        return None
    from draftwheel import tracking

    name, version, alias = tracking.parse_model_uri(uri)
    for row in tracking.list_versions(name):
        if (alias in row["aliases"]) if alias else row["version"] == str(version):
            return f"{name} version {row['version']}" + (f" ({alias})" if alias else ""), row["tags"]
    return None


def resolve_target(spec: str | Path | None = None, draft: str | Path | None = CHAMPION_URI,
                   convert_reference: bool = True) -> str:
    """The target a command serves or trains for: `spec` when given; else the one the draft in use was
    trained for (the registry version `draft` names, or the champion when `draft` is no registry URI), as
    its tags record it (`recorded_target`); with no such version, or one that records no place, the
    reference target (converted once unless `convert_reference` is False). Raises `TargetGoneError` when
    the recorded target is gone, `draftwheel.tracking.RegistryError` when the registry cannot be read."""
    if spec:
        return str(spec)
    found = _version_in_use(draft)
    recorded = recorded_target(found[1], found[0]) if found is not None else None
    if recorded is not None:
        return recorded
    from draftwheel.serving.engine.reference import default_target_dir, ensure_reference_target

    return str(ensure_reference_target(home.models_dir()) if convert_reference else default_target_dir())
