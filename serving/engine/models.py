"""Loading target/draft models for the engine and checking that a pair can be used together.

`load_model(spec)` accepts a local model dir or a Hugging Face hub id; a registry URI `models:/NAME@ALIAS`
is resolved one floor up (`draftwheel.serving.loading`), so the engine stays free of MLflow. It does not
download anything in tests: hub ids are only resolved when given explicitly, and hub access follows
HF_HUB_OFFLINE. Weights are read from safetensors
only: a dir without them is refused before anything in it is opened, since a pickle checkpoint
(`pytorch_model.bin`) runs code when it is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from draftwheel.hashing import weights_sha256  # noqa: F401 - re-exported: part of this module's API
from draftwheel.registry_names import TARGET_SHA_TAG, URI_PREFIX, not_trained_for, trained_for
from draftwheel.serving.engine.records import ModelId


class UnsafeWeightsError(ValueError):
    """A model dir whose weights are not safetensors: nothing in it is loaded."""


class IncompatibleModelsError(ValueError):
    """A target/draft pair that cannot be verified against each other (different vocabularies)."""


@dataclass
class LoadedModel:
    model: Any  # a transformers PreTrainedModel, in eval mode
    tokenizer: Any
    model_id: ModelId
    path: Path
    tags: dict[str, str] = field(default_factory=dict)
    """Registry version tags (models:/ URIs only), e.g. `target_sha256` of the target it was trained for."""
    kind: str = "lm"
    """Draft kind (design.md): `lm` (a causal LM) or `eagle3` (draftwheel.serving.engine.eagle, reads the target's features)."""

    @property
    def from_registry(self) -> bool:
        """A registry version (its id carries the version): it must name the target it was trained for."""
        return bool(self.model_id.version)


def _resolve(spec: str) -> tuple[Path, ModelId | None]:
    """spec -> (local dir, id when the hub names it)."""
    if spec.startswith(URI_PREFIX):
        raise ValueError(f"model {spec!r}: a registry URI; load it with draftwheel.serving.loading.load_model")
    path = Path(spec).expanduser()
    if path.is_dir():
        return path, None
    if path.exists() or spec.startswith((".", "/", "~")) or spec.count("/") > 1:
        raise FileNotFoundError(f"model {spec!r}: not a model directory")
    # A hub id ("org/name"): fetch (or find in the local HF cache) its snapshot.
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(spec)), ModelId(name=spec)


def resolve_spec(spec: str | Path) -> Path:
    """The local directory a model spec (dir or hub id) names."""
    return _resolve(str(spec))[0]


def require_safetensors(path: Path, spec: str) -> None:
    """Refuse a model dir without safetensors weights before any loader opens its files: transformers
    would otherwise fall back to unpickling `pytorch_model.bin`, and a crafted pickle runs code."""
    if any(path.glob("*.safetensors")):
        return
    names = sorted(p.name for p in path.iterdir() if not p.name.startswith("."))
    found = ", ".join(names[:8]) + (f" and {len(names) - 8} more" if len(names) > 8 else "") or "nothing"
    raise UnsafeWeightsError(f"model {spec!r}: {path} has no .safetensors weights (found: {found}); "
                             "pickle weights are never loaded: save the model with safetensors")


def draft_kind(path: str | Path) -> str:
    """The kind a saved model dir is (`registry_names.DRAFT_KINDS`): eagle3 and Medusa dirs say so in their
    files (draftwheel.serving.engine.eagle, draftwheel.serving.engine.medusa); anything else is a causal LM."""
    from draftwheel.serving.engine.eagle import is_eagle3_dir
    from draftwheel.serving.engine.medusa import is_medusa_dir

    return "eagle3" if is_eagle3_dir(path) else "medusa" if is_medusa_dir(path) else "lm"


def load_model(spec: str | Path, device: str = "cpu", dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load a causal LM (or an eagle3 draft) and its tokenizer from a local dir or a hub id."""
    path, model_id = _resolve(str(spec))
    return load_resolved(path, str(spec), model_id, {}, device, dtype)


def load_resolved(path: Path, spec: str, model_id: ModelId | None, tags: dict[str, str], device: str = "cpu",
                  dtype: torch.dtype = torch.float32) -> LoadedModel:
    """Load the model in the local dir `path` that `spec` named (`model_id`, `tags`: what its registry
    version or hub id says of it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftwheel.serving.engine.eagle import is_eagle3_dir, load_eagle3

    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"model {spec!r}: {path} has no config.json")
    require_safetensors(path, spec)
    kind = "eagle3" if is_eagle3_dir(path) else "lm"
    if kind == "eagle3":
        model = load_eagle3(path).to(device=device, dtype=dtype)
        if model.c.target_sha256 and TARGET_SHA_TAG not in tags:
            tags = {**tags, TARGET_SHA_TAG: model.c.target_sha256}
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, use_safetensors=True).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model_id = model_id or ModelId(name=path.resolve().name)
    model_id.sha256 = weights_sha256(path)
    return LoadedModel(model=model, tokenizer=tokenizer, model_id=model_id, path=path, tags=tags, kind=kind)


def check_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """Raise `IncompatibleModelsError` naming both models unless they share one vocabulary and the draft
    was trained for this target (`registry_names.trained_for`): a registry version must say which target
    it was trained for; a local dir is checked only when it says so (an eagle3 config does). An `eagle3`
    draft is attached to the target here (it reads the target's embedding table)."""
    names = f"target {target.model_id.name!r} ({target.path}) and draft {draft.model_id.name!r} ({draft.path})"
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise IncompatibleModelsError(f"{names} have different tokenizer vocabularies "
                                      f"({len(target.tokenizer)} vs {len(draft.tokenizer)} tokens)")
    target_v, draft_v = target.model.config.vocab_size, draft.model.config.vocab_size
    if target_v != draft_v:
        raise IncompatibleModelsError(f"{names} have different output sizes (vocab_size {target_v} vs {draft_v})")
    if draft.kind == "eagle3":
        try:
            draft.model.attach_target(target.model)  # shares the target's embeddings; checks shapes
        except ValueError as exc:
            raise IncompatibleModelsError(f"{names}: {exc}") from exc
    _check_trained_for(target, draft, names)


def _check_trained_for(target: LoadedModel, draft: LoadedModel, names: str) -> None:
    """The draft's target tag against the target's weights hash (an in-memory target has none: then a
    registry version only has to carry the tag)."""
    if not (draft.from_registry or draft.tags.get(TARGET_SHA_TAG)):
        return  # a local dir that names no target: the vocabulary check above is all there is
    target_sha = target.model_id.sha256 or None
    if trained_for(draft.tags, target_sha):
        return
    recorded = draft.tags.get(TARGET_SHA_TAG, "")
    if not recorded:
        raise IncompatibleModelsError(f"{names}: the draft has {not_trained_for(draft.tags, target_sha)}")
    raise IncompatibleModelsError(f"{names}: the draft was trained for target weights {recorded[:12]}, "
                                  f"not {target_sha[:12]}")


def from_objects(model: Any, tokenizer: Any, name: str, path: str | Path = "") -> LoadedModel:
    """Wrap an in-memory model (tests, benchmarks) as a LoadedModel without a weights hash."""
    from draftwheel.serving.engine.eagle import Eagle3Draft

    kind = "eagle3" if isinstance(model, Eagle3Draft) else "lm"
    return LoadedModel(model=model.eval(), tokenizer=tokenizer, model_id=ModelId(name=name), path=Path(path),
                       kind=kind)
