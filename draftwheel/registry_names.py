"""The registry's names, in one place: registered models, aliases, version tags, `models:/` URIs, and what
a version is as an MLflow model (the pyfunc loader, where the files serving loads lie, the predict columns).

Serving, training, the flows and the command line import these instead of spelling them. Data and tiny
pure functions only: no MLflow, no I/O (the registry calls live in `draftwheel.tracking`, the register /
promote / status path in `draftwheel.registry`). `trained_for` is the one answer to "was this version
trained for this target": promotion, serving's compatibility check and hot reload all ask it.
"""

from __future__ import annotations

from collections.abc import Mapping

URI_PREFIX = "models:/"

DRAFT_MODEL = "draftwheel-draft"
"""Every draft kind that replaces the draft model (lm, eagle3, ...) is a version of this model."""
MEDUSA_MODEL = "draftwheel-medusa"
"""Medusa heads live on the target, so they are versions of their own model."""
REGISTERED_MODELS = (DRAFT_MODEL, MEDUSA_MODEL)
DRAFT_KINDS = ("lm", "eagle3", "medusa")
"""What a registered version is (design.md's draft kinds that are trained and stored)."""

CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous"
ALIASES = (CHAMPION, CHALLENGER, PREVIOUS)
"""champion: what serving loads; challenger: the newest candidate the gate did not reject;
previous: the champion before the current one (what `rollback` returns to)."""

# Version tags.
TARGET_SHA_TAG = "target_sha256"
"""weights_sha256 of the target the draft was trained for; serving refuses a draft whose tag differs."""
FILES_DIR_TAG = "files_dir"
"""Where in a version's artifacts the files serving loads lie (`FILES_DIR` in the MLflow model). Absent on
versions registered before drafts were MLflow models: their artifacts are those files, nothing else."""
TARGET_DIR_TAG = "target_dir"
"""Where that target's model dir was when the version was registered: relative to the state dir when it lies
inside it (a moved or copied state dir finds its own copy), else absolute. With `TARGET_HUB_TAG`, what a
command given no `--target` serves and trains for (`draftwheel.serving.loading.resolve_target`)."""
TARGET_HUB_TAG = "target_hub_id"
"""The target's Hugging Face id where known (a hub id given as the target, a hub cache snapshot, the
reference target), else absent: where the target can be fetched again when its dir is gone."""
WEIGHTS_TAG = "weights_sha256"
FILES_TAG = "files_sha256"
"""{file name: sha256} of every registered file, checked on every resolve."""
MANIFEST_TAG = "manifest_sha256"
TRAINING_CONFIG_TAG = "training_config"
DELIVERED_TAG = "delivered_gain"
"""The monitor's live figures per slice of this version as champion against the previous champion's."""
SHADOW_REPORT_TAG = "shadow_report"
"""JSON summary of the shadow run (`draftwheel.registry.report_summary`), incl. the report's path."""
PARENT_TAG = "parent_version"
"""The champion version a flywheel candidate was trained from and gated against."""
STAGE_TAG = "stage"
"""What produced the version: "bootstrap", or the trainer's name."""
DRAFT_KIND_TAG = "draft_kind"
"""The version's kind, one of `DRAFT_KINDS`, as its files say at registration (`draftwheel.serving.engine.models.draft_kind`), so a
reader of the registry knows what a version is without downloading it."""


def model_for_kind(kind: str) -> str:
    """The registered model a version of `kind` belongs to: Medusa heads apart, every draft kind together."""
    return MEDUSA_MODEL if kind == "medusa" else DRAFT_MODEL


def trained_for(tags: Mapping[str, str], target_sha: str | None) -> bool:
    """Whether a version with `tags` may serve the target whose weights hash is `target_sha`. A version
    without the `target_sha256` tag records no target and may serve none; `target_sha` None (no target to
    compare with, e.g. the first champion) asks only that the tag be there."""
    recorded = tags.get(TARGET_SHA_TAG, "")
    return bool(recorded) and (target_sha is None or recorded == target_sha)


def not_trained_for(tags: Mapping[str, str], target_sha: str | None, target: str = "the target") -> str:
    """Why `trained_for(tags, target_sha)` is False, naming the target as `target` ("the served target")."""
    recorded = tags.get(TARGET_SHA_TAG, "")
    if not recorded:
        return f"no {TARGET_SHA_TAG} tag: it records no target it was trained for, so no target may serve it"
    return f"trained for target {recorded[:12]}, but {target} is {(target_sha or '')[:12] or '(no weights hash)'}"


def model_uri(alias: str = CHAMPION, name: str = DRAFT_MODEL) -> str:
    """`models:/NAME@ALIAS`."""
    return f"{URI_PREFIX}{name}@{alias}"


def version_uri(version: str | int, name: str = DRAFT_MODEL) -> str:
    """`models:/NAME/VERSION`."""
    return f"{URI_PREFIX}{name}/{version}"


CHAMPION_URI = model_uri(CHAMPION)
"""`models:/draftwheel-draft@champion`: the draft serving, the flows and the trainers start from."""


# A registered version as an MLflow model (`draftwheel.tracking.register_draft` writes it).
PYFUNC_LOADER = "draftwheel.serving.draft_pyfunc"
"""The pyfunc flavor's `loader_module`: MLflow imports it and calls `_load_pyfunc(data_path, model_config)`."""
FILES_DIR = "data/draft"
"""The pyfunc data path inside the MLflow model: exactly the files serving loads (`files_sha256`)."""
PREDICT_INPUTS = (("prompt", "string"), ("token_ids", "long[]"), ("k", "long"), ("chat", "boolean"))
"""predict's input columns, all optional per row: a `prompt` or the context's `token_ids`, how many tokens
to propose (`k`), whether the prompt is a chat message (`chat`). Types: MLflow's names, `[]` an array."""
PREDICT_OUTPUTS = (("token_ids", "long[]"), ("text", "string"))
"""predict's output columns: the proposed token ids and their text."""
