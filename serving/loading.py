"""Models and engines by any name a user gives: a local dir, a Hugging Face hub id, or a registry URI
`models:/NAME@ALIAS` (or `models:/NAME/VERSION`).

The engine loads dirs and hub ids (`draftwheel.serving.engine.models`); this module adds the registry,
through `draftwheel.tracking` (imported lazily: MLflow loads only when a registry URI is given), so the
engine itself stays free of MLflow. Everything above the engine that takes a model spec loads it here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from draftwheel.hashing import file_sha256
from draftwheel.registry_names import URI_PREFIX
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
                      metrics: Any = None, prepack: bool = True, min_path_prob: float = 0.0) -> Engine:
    """Load the models and build the engine that serves them in `dtype`
    (`draftwheel.serving.engine.precision.resolve_dtype` turns a setting into one)."""
    target_model = load_model(target, device, dtype)
    draft_model = load_model(draft, device, dtype) if draft is not None else None
    heads = heads_id = None
    if medusa is not None:
        from draftwheel.serving.engine.medusa import WEIGHTS_FILE, MedusaHeads

        heads = MedusaHeads.load(medusa, target_model.model).to(device=device, dtype=dtype).eval()
        heads_id = ModelId(name=Path(medusa).resolve().name, sha256=file_sha256(Path(medusa) / WEIGHTS_FILE))
    return Engine(target_model, draft_model, heads, sink=sink, metrics=metrics, medusa_id=heads_id, prepack=prepack,
                  min_path_prob=min_path_prob)
