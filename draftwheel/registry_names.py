"""The registry's names, in one place: registered models, aliases, version tags and `models:/` URIs.

Serving, training, the flows and the command line import these instead of spelling them. Data and two
tiny functions only: no MLflow, no I/O (the registry calls live in `draftwheel.tracking`, the register /
promote / status path in `draftwheel.registry`).
"""

from __future__ import annotations

URI_PREFIX = "models:/"

DRAFT_MODEL = "draftwheel-draft"
"""Every draft kind that replaces the draft model (lm, eagle3, ...) is a version of this model."""
MEDUSA_MODEL = "draftwheel-medusa"
"""Medusa heads live on the target, so they are versions of their own model."""
REGISTERED_MODELS = (DRAFT_MODEL, MEDUSA_MODEL)

CHAMPION, CHALLENGER, PREVIOUS = "champion", "challenger", "previous"
ALIASES = (CHAMPION, CHALLENGER, PREVIOUS)
"""champion: what serving loads; challenger: the newest candidate the gate did not reject;
previous: the champion before the current one (what `rollback` returns to)."""

# Version tags.
TARGET_SHA_TAG = "target_sha256"
"""weights_sha256 of the target the draft was trained for; serving refuses a draft whose tag differs."""
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


def model_uri(alias: str = CHAMPION, name: str = DRAFT_MODEL) -> str:
    """`models:/NAME@ALIAS`."""
    return f"{URI_PREFIX}{name}@{alias}"


def version_uri(version: str | int, name: str = DRAFT_MODEL) -> str:
    """`models:/NAME/VERSION`."""
    return f"{URI_PREFIX}{name}/{version}"


CHAMPION_URI = model_uri(CHAMPION)
"""`models:/draftwheel-draft@champion`: the draft serving, the flows and the trainers start from."""
