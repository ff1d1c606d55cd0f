"""A registered draft version as an MLflow pyfunc model: `predict` says which tokens the draft proposes next.

Every version `draftwheel.registry.register_version` registers is an MLflow model whose MLmodel names this
module as the pyfunc flavor's `loader_module` (`registry_names.PYFUNC_LOADER`) and the files serving loads
as its data (`registry_names.FILES_DIR`), so

    model = mlflow.pyfunc.load_model("models:/draftwheel-draft@champion")
    model.predict([{"prompt": "def add(a, b):", "k": 4}])   # -> DataFrame: token_ids, text

gives per input row the `token_ids` the draft proposes right after that context and their `text`: the chain
the engine's draft would verify there (`draftwheel.serving.engine.proposal.propose`, greedy, no chain cut).

What predict needs:
- per row, `prompt` (a string, tokenised as serving tokenises a completion request, or with the chat
  template when `chat` is true) or `token_ids` (the context as token ids, taken as they are; they win over
  `prompt`), and `k`, how many tokens to propose (default 4; Medusa heads propose one per head at most);
- the target the draft was trained for, loaded once with the model: an `eagle3` draft and Medusa heads read
  its hidden states. It comes from `model_config["target"]` (a model dir or a Hugging Face id) when given,
  else from where the version's tags recorded it (`target_dir`, `target_hub_id`:
  `draftwheel.serving.loading.recorded_target`), else, for an eagle3 draft, from the hub id its config
  names as verifier. It must be the target whose weights hash the version records (`target_sha256`), the
  check serving makes. An `lm` draft does not read the target: it uses it when one is found (and the pair
  is checked as serving checks it) and otherwise proposes alone, with its own tokenizer.
  `mlflow.pyfunc.load_model(uri, model_config={"target": "/models/my-target", "device": "cuda"})` sets it;
  `device` and `dtype` (float32, bfloat16, auto) are the other settings.

The models are built as serving builds them (`draftwheel.serving.engine.engine.Engine`: packed linear layers,
the eagle3 draft attached to the target), so the proposals are the engine's. This module does not import
MLflow: MLflow imports it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd

from draftwheel.registry_names import (PREDICT_OUTPUTS, TARGET_DIR_TAG, TARGET_HUB_TAG, TARGET_SHA_TAG,
                                       not_trained_for, trained_for)
from draftwheel.serving import loading
from draftwheel.serving.engine import models
from draftwheel.serving.engine.engine import Engine, encode
from draftwheel.serving.engine.models import IncompatibleModelsError, LoadedModel
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.precision import resolve_dtype
from draftwheel.serving.engine.prepack import prepack_linears
from draftwheel.serving.engine.proposal import propose

log = logging.getLogger(__name__)

DEFAULT_K = SamplingParams().k


class TargetNotFoundError(FileNotFoundError):
    """A draft that reads its target's hidden states, and no target to load."""


def _load_pyfunc(data_path: str, model_config: dict[str, Any] | None = None) -> "DraftProposer":
    """MLflow's entry point: the version's files (`data_path`) and its merged `model_config`."""
    return DraftProposer(Path(data_path), model_config or {})


class DraftProposer:
    """The models of one version, loaded once; `predict` proposes for each row (module docstring)."""

    def __init__(self, files: Path, config: dict[str, Any]):
        device = config.get("device") or "cpu"
        dtype = resolve_dtype(config.get("dtype") or "float32", device)
        self.kind = models.draft_kind(files)
        recorded = {tag: config.get(tag) or "" for tag in (TARGET_DIR_TAG, TARGET_HUB_TAG, TARGET_SHA_TAG)}
        self.heads = self.draft = None
        draft = None
        if self.kind != "medusa":
            tags = {TARGET_SHA_TAG: recorded[TARGET_SHA_TAG]} if recorded[TARGET_SHA_TAG] else {}
            draft = models.load_resolved(files, str(files), None, tags, device, dtype)
        target = self._load_target(config.get("target") or "", recorded, draft, device, dtype)
        if target is None:  # an lm draft alone (`_load_target` refuses it for the kinds that read a target)
            prepack_linears(draft.model)  # as the engine packs every model it serves
            self.draft, self.target, self.tokenizer = draft, None, draft.tokenizer
            return
        heads = self._load_heads(files, target, recorded[TARGET_SHA_TAG]) if self.kind == "medusa" else None
        engine = Engine(target, draft, heads)  # casts, packs, attaches and checks the pair as serving does
        self.draft, self.target, self.heads, self.tokenizer = engine.draft, engine.target, engine.medusa, \
            target.tokenizer

    def _load_target(self, given: str, recorded: dict[str, str], draft: LoadedModel | None, device: str,
                     dtype: Any) -> LoadedModel | None:
        try:
            spec = given or loading.recorded_target(recorded, "this draft")
        except loading.TargetGoneError as exc:
            raise TargetNotFoundError(f"{exc} (here: model_config={{'target': DIR_OR_HUB_ID}})") from exc
        if not spec and draft is not None and draft.kind == "eagle3":
            spec = draft.model.c.verifier_name
        if spec:
            return loading.load_model(spec, device, dtype)
        if self.kind == "lm":
            log.info("no target recorded or given: the lm draft proposes alone")
            return None
        raise TargetNotFoundError(f"target: this {self.kind} draft reads its target's hidden states, and its "
                                  "registry version records no target; load it with "
                                  "model_config={'target': DIR_OR_HUB_ID}")

    @staticmethod
    def _load_heads(files: Path, target: LoadedModel, recorded_sha: str) -> Any:
        from draftwheel.serving.engine.medusa import MedusaHeads

        heads = MedusaHeads.load(files, target.model)
        recorded = {TARGET_SHA_TAG: recorded_sha or heads.target_sha256 or ""}
        if not trained_for(recorded, target.model_id.sha256 or None):
            raise IncompatibleModelsError(f"medusa heads {files}: {not_trained_for(recorded, target.model_id.sha256)}")
        return heads

    def _context(self, row: dict[str, Any], index: int) -> list[int]:
        ids, prompt = row.get("token_ids"), row.get("prompt")
        if _given(ids):
            return [int(token) for token in ids]
        if _given(prompt):
            return encode(self.tokenizer, prompt, bool(_given(row.get("chat")) and row["chat"]))[1]
        raise ValueError(f"row {index}: give a `prompt` or the context's `token_ids`")

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> pd.DataFrame:
        """One row per input row: the proposed `token_ids` and their `text` (module docstring)."""
        rows = []
        for index, row in enumerate(_rows(model_input)):
            k = int(row["k"]) if _given(row.get("k")) else DEFAULT_K
            proposed = propose(self._context(row, index), k, draft=self.draft, target=self.target, heads=self.heads)
            rows.append({"token_ids": proposed, "text": self.tokenizer.decode(proposed)})
        return pd.DataFrame(rows, columns=[name for name, _ in PREDICT_OUTPUTS])


def _rows(model_input: Any) -> list[dict[str, Any]]:
    """A DataFrame (MLflow's schema enforcement makes one), a list of dicts or one dict -> a list of dicts."""
    if isinstance(model_input, pd.DataFrame):
        return model_input.to_dict(orient="records")
    if isinstance(model_input, dict):
        return [model_input]
    return [dict(row) for row in model_input]


def _given(value: Any) -> bool:
    """False for what a missing optional column holds: None, NaN or pandas' NA (a string or an array of
    token ids is given, even when empty: `propose` names what is wrong with it)."""
    if value is None:
        return False
    return True if hasattr(value, "__len__") else not pd.isna(value)
