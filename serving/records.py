"""Acceptance record: the serving log schema (v1), one JSON object per finished request.

This module is the contract between serving (writer) and mining (reader). It defines the record,
its JSON form, and `parse_record`, which validates one log line and raises `RecordError` with a
short reason for anything malformed. It does no I/O; the append-only sink lives in `serving.sink`.
See docs/log-schema.md for the field-by-field description.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

SCHEMA_VERSION = 1
MODES = ("draft", "medusa", "autoregressive")


class RecordError(ValueError):
    """A log line is not a valid acceptance record; `str(exc)` is the reason."""


@dataclass
class ModelId:
    name: str
    version: str = ""
    sha256: str = ""


@dataclass
class Sampling:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None


@dataclass
class Step:
    """One verification step: `k` drafted, `accepted` of them taken, then the target's own token
    (`target_token_id`: the correction at the first rejection, or the bonus token if all accepted)."""
    k: int
    accepted: int
    draft_token_ids: list[int]
    target_token_id: int


@dataclass
class AcceptanceRecord:
    request_id: str
    ts: float
    slice: str
    target_id: ModelId
    draft_id: ModelId | None
    mode: str
    sampling: Sampling
    prompt: str
    prompt_token_ids: list[int]
    output: str
    output_token_ids: list[int]
    finish_reason: str
    steps: list[Step] = field(default_factory=list)
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    verify_steps: int = 0
    ttft_s: float = 0.0
    latency_s: float = 0.0
    schema_version: int = SCHEMA_VERSION

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target verification step, bonus token included (vLLM's definition)."""
        return (self.accepted_tokens + self.verify_steps) / self.verify_steps if self.verify_steps else 0.0

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), ensure_ascii=False, separators=(",", ":"))


_INT_LIST = "list[int]"
# field -> (accepted python types, description used in error messages)
_TOP_LEVEL: dict[str, tuple[tuple[type, ...], str]] = {
    "request_id": ((str,), "str"),
    "ts": ((int, float), "number"),
    "slice": ((str,), "str"),
    "mode": ((str,), "str"),
    "prompt": ((str,), "str"),
    "prompt_token_ids": ((list,), _INT_LIST),
    "output": ((str,), "str"),
    "output_token_ids": ((list,), _INT_LIST),
    "finish_reason": ((str,), "str"),
    "steps": ((list,), "list"),
    "drafted_tokens": ((int,), "int"),
    "accepted_tokens": ((int,), "int"),
    "verify_steps": ((int,), "int"),
    "ttft_s": ((int, float), "number"),
    "latency_s": ((int, float), "number"),
}


def _check_type(name: str, value: Any, types: tuple[type, ...], desc: str) -> None:
    # bool is an int subclass in Python; a JSON `true` is never a valid count.
    if isinstance(value, bool) or not isinstance(value, types):
        raise RecordError(f"field {name!r}: expected {desc}, got {type(value).__name__}")
    if desc == _INT_LIST and not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise RecordError(f"field {name!r}: expected a list of ints")


def _model_id(name: str, value: Any, optional: bool) -> ModelId | None:
    if value is None and optional:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise RecordError(f"field {name!r}: expected an object with a string 'name'")
    return ModelId(name=value["name"], version=str(value.get("version", "")), sha256=str(value.get("sha256", "")))


def _step(index: int, value: Any) -> Step:
    if not isinstance(value, dict):
        raise RecordError(f"steps[{index}]: expected an object")
    try:
        step = Step(k=value["k"], accepted=value["accepted"], draft_token_ids=value["draft_token_ids"],
                    target_token_id=value["target_token_id"])
    except KeyError as exc:
        raise RecordError(f"steps[{index}]: missing {exc.args[0]!r}") from exc
    for name in ("k", "accepted", "target_token_id"):
        _check_type(f"steps[{index}].{name}", getattr(step, name), (int,), "int")
    _check_type(f"steps[{index}].draft_token_ids", step.draft_token_ids, (list,), _INT_LIST)
    if not 0 <= step.accepted <= step.k:
        raise RecordError(f"steps[{index}]: accepted={step.accepted} outside 0..k={step.k}")
    return step


def record_from_dict(data: Any) -> AcceptanceRecord:
    """Validate a decoded JSON object and build the record; raise `RecordError` on any defect."""
    if not isinstance(data, dict):
        raise RecordError(f"expected a JSON object, got {type(data).__name__}")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise RecordError(f"unknown schema_version {version!r} (this reader knows {SCHEMA_VERSION})")
    for name, (types, desc) in _TOP_LEVEL.items():
        if name not in data:
            raise RecordError(f"missing field {name!r}")
        _check_type(name, data[name], types, desc)
    if data["mode"] not in MODES:
        raise RecordError(f"field 'mode': {data['mode']!r} not one of {', '.join(MODES)}")
    sampling = data.get("sampling")
    if not isinstance(sampling, dict):
        raise RecordError("field 'sampling': expected an object")
    try:
        sampling_obj = Sampling(**sampling)
    except TypeError as exc:
        raise RecordError(f"field 'sampling': {exc}") from exc
    return AcceptanceRecord(
        request_id=data["request_id"], ts=float(data["ts"]), slice=data["slice"],
        target_id=_model_id("target_id", data.get("target_id"), optional=False),
        draft_id=_model_id("draft_id", data.get("draft_id"), optional=True),
        mode=data["mode"], sampling=sampling_obj, prompt=data["prompt"],
        prompt_token_ids=data["prompt_token_ids"], output=data["output"],
        output_token_ids=data["output_token_ids"], finish_reason=data["finish_reason"],
        steps=[_step(i, s) for i, s in enumerate(data["steps"])],
        drafted_tokens=data["drafted_tokens"], accepted_tokens=data["accepted_tokens"],
        verify_steps=data["verify_steps"], ttft_s=float(data["ttft_s"]), latency_s=float(data["latency_s"]),
    )


def parse_record(line: str | bytes) -> AcceptanceRecord:
    """Parse and validate one JSONL line."""
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordError(f"not JSON: {exc.msg if hasattr(exc, 'msg') else exc}") from exc
    except RecursionError as exc:  # absurdly deep nesting: malformed, not a crash
        raise RecordError("not JSON: nested too deeply") from exc
    try:
        return record_from_dict(data)
    except OverflowError as exc:  # e.g. a 400-digit integer `ts` that float() cannot hold
        raise RecordError(f"invalid value: number out of range: {exc}") from exc
