"""Acceptance record: the serving log schema (v1), one JSON object per finished request.

This module is the one definition of the contract between serving (writer) and mining (reader): the
dataclasses below are the schema, and everything else is generated from them. `to_dict`/`to_json`
write a record; `parse_record` reads one log line, decoding it straight into the dataclasses with
msgspec (types checked in C, one pass) and checking the invariants a type cannot express (counts
non-negative, `0 <= accepted <= drafted`, totals equal to the step list, token ids in range). It
raises `RecordError` for anything malformed and nothing else, whatever the bytes. It does no I/O; the
append-only sink lives in `draftwheel.serving.engine.sink`, the acceptance formulas in `draftwheel.serving.engine.acceptance`.
See docs/log-schema.md for the field-by-field description.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Iterable, Literal, get_args

import msgspec

from draftwheel.serving.engine import acceptance

SCHEMA_VERSION = 1
Mode = Literal["draft", "medusa", "autoregressive", "suffix", "hybrid"]
MODES: tuple[str, ...] = get_args(Mode)
TOKEN_ID_LIMIT = 2**31
"""Token ids must be below this when the vocabulary size is not known (no tokenizer has more)."""


class RecordError(ValueError):
    """A log line is not a valid acceptance record; `str(exc)` is the reason, `kind` groups reasons:
    not_json, not_an_object, unknown_schema_version, missing_field, wrong_type, bad_step,
    out_of_range, inconsistent."""

    def __init__(self, reason: str, kind: str):
        super().__init__(reason)
        self.kind = kind


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
class Beside:
    """The other proposal a token-tree step verified in the same target forward
    (draftwheel.serving.engine.tree): `k` tokens, `accepted` of them the target's, and what drafted them.
    The step itself records the proposal that was accepted further."""
    k: int
    accepted: int
    draft_token_ids: list[int]
    source: str | None = None


@dataclass
class Step:
    """One verification step: `k` drafted, `accepted` of them taken, then the target's own token
    (`target_token_id`: the correction at the first rejection, or the bonus token if all accepted)."""
    k: int
    accepted: int
    draft_token_ids: list[int]
    target_token_id: int
    source: str | None = None
    """What drafted this step (`draft`, `suffix`, ...); None in older records and for k=0 steps.
    Written only when set (see docs/log-schema.md)."""
    beside: Beside | None = None
    """A token-tree step's other proposal; written only when set."""


def verify_rows(step: Any) -> int:
    """Rows of a step's (or a read step line's) verification forward: the last token, the k proposed, and
    the proposal beside them where it differs (a token tree shares the two proposals' common prefix)."""
    if step.beside is None:
        return step.k + 1
    other = step.beside.draft_token_ids
    return step.k + 1 + len(other) - acceptance.common_prefix(step.draft_token_ids, other)


@dataclass
class AcceptanceRecord:
    request_id: str
    ts: float
    slice: str
    target_id: ModelId
    draft_id: ModelId | None
    mode: Mode
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
    schema_version: Literal[1] = SCHEMA_VERSION  # a bump changes this type: v1 decoding refuses other versions
    source: str | None = None
    """Which engine served the request when it was not this one (`vllm`, `proxy:HOST:PORT`, `ingest:FILE`):
    such a record carries the totals that engine reported and no steps. None (not written) for this
    engine's own records, so they stay byte-identical to older v1 records (see docs/log-schema.md)."""

    @property
    def acceptance_rate(self) -> float:
        return acceptance.acceptance_rate(self.accepted_tokens, self.drafted_tokens)

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per target verification step, bonus token included (vLLM's definition)."""
        return acceptance.mean_accepted_length(self.accepted_tokens, self.verify_steps)

    def to_dict(self) -> dict[str, Any]:
        """The JSON object of this record (plain dicts and lists); `source` (its own and a step's) only when set."""
        data = msgspec.to_builtins(self)
        if data["source"] is None:
            del data["source"]
        for step in data["steps"]:
            for name in ("source", "beside"):
                if step[name] is None:
                    del step[name]
            if "beside" in step and step["beside"]["source"] is None:
                del step["beside"]["source"]
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))


EAGLE3 = "eagle3"
"""The `source` of a step whose tokens an eagle3 draft's chain drafted (draftwheel.serving.engine.eagle_decoding)."""
LM_DRAFT = "draft"
"""The `source` of a hybrid step whose tokens an `lm` draft drafted (draftwheel.serving.engine.suffix_decoding)."""
SUFFIX = "suffix"
"""The `source` of a step whose tokens the suffix index proposed (draftwheel.serving.engine.suffix), and of a
token tree's index branch (`Beside`)."""
MODEL_SOURCES = (EAGLE3, LM_DRAFT)
"""The sources of steps a draft model drafted, at its per-token cost (draftwheel.evaluation.served_cost);
steps of mode draft or medusa carry no source and are the model's too (`draft_steps`)."""
LOAD = "load"
"""The `source` of a plain step taken while the batch engine's governor capped the draft model (regimes
`index` and `plain` at that batch size, draftwheel.serving.engine.adaptive.SpecGovernor): the draft was not
allowed to draft, so the step says nothing about it."""


def draft_steps(record: Any) -> list[Any]:
    """The steps of an `AcceptanceRecord` (or a decoded log line) that the draft model drafted: a hybrid
    record's suffix-index steps and its plain steps (no source, nothing drafted: the step pace chose the
    target alone) are left out -- they measure the index and the pace, not the draft, which is what the
    monitor and mining judge; so are the plain steps load imposed (`LOAD`), in every mode."""
    steps = [step for step in record.steps if step.source != LOAD]
    if record.mode != "hybrid":
        return steps
    # a token-tree step the index's branch won: the draft's chain beside it is the draft's step
    return [step.beside if step.source == SUFFIX and step.beside is not None else step for step in steps
            if (step.source != SUFFIX or step.beside is not None) and (step.source or step.k)]


def draft_counts(record: Any) -> tuple[int, int, int]:
    """(drafted tokens, accepted tokens, verify steps) over `draft_steps(record)`."""
    if record.mode != "hybrid" and not any(step.source == LOAD for step in record.steps):
        return record.drafted_tokens, record.accepted_tokens, record.verify_steps  # the record's own totals
    own = draft_steps(record)
    return sum(step.k for step in own), sum(step.accepted for step in own), len(own)


PLAIN = "plain"
"""`step_source` of a step that drafted nothing and that load did not impose: the target alone."""


def step_source(step: Any, mode: str) -> str:
    """Who proposed a step's tokens: its `source`; `PLAIN` for a step that drafted nothing; a drafted step
    without a source (the loops of modes draft and medusa write none) is named by its mode."""
    return step.source or (PLAIN if not step.k else mode)


def source_counts(records: Iterable[Any]) -> dict[str, list[int]]:
    """Per `step_source`, [verify steps, tokens emitted] over some records (`AcceptanceRecord`s or
    decoded log lines). Counts, not shares, so that rows summed over requests stay exact."""
    counts: dict[str, list[int]] = {}
    for record in records:
        for step in record.steps:
            entry = counts.setdefault(step_source(step, record.mode), [0, 0])
            entry[0] += 1
            entry[1] += step.accepted + 1
    return counts


def add_counts(parts: Iterable[dict[str, list[int]]]) -> dict[str, list[int]]:
    """The sum of several `source_counts`."""
    total: dict[str, list[int]] = {}
    for part in parts:
        for name, (steps, tokens) in part.items():
            entry = total.setdefault(name, [0, 0])
            entry[0] += steps
            entry[1] += tokens
    return total


def source_shares(counts: dict[str, list[int]]) -> dict[str, dict[str, float]]:
    """Where the steps went (`source_counts`): per source, most steps first, its share of the steps and the
    tokens each of its steps emitted. This is how an as-served figure splits between the suffix index, the
    draft model and plain steps: a draft's own gain reaches serving only through its share."""
    total = sum(steps for steps, _ in counts.values()) or 1
    return {name: {"share": steps / total, "tokens_per_step": tokens / steps}
            for name, (steps, tokens) in sorted(counts.items(), key=lambda item: -item[1][0]) if steps}


def describe_shares(shares: dict[str, dict[str, float]]) -> str:
    """`source_shares` in one line: "suffix 79% x 3.64, eagle3 4% x 1.00, plain 17% x 1.00" (share of the
    steps x tokens each)."""
    return ", ".join(f"{name} {v['share']:.0%} x {v['tokens_per_step']:.2f}" for name, v in shares.items())


def _substitute(hint: Any, structs: dict[type, type]) -> Any:
    """`hint` with the dataclasses in it replaced by their generated Structs (`list[Step]` -> `list[StepLine]`)."""
    if hint in structs:
        return structs[hint]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is list:
        return list[_substitute(args[0], structs)]
    if origin in (typing.Union, types.UnionType):
        return typing.Union[tuple(_substitute(arg, structs) for arg in args)]
    return hint


OPTIONAL_FIELDS = ("source",)
"""Top-level fields added within v1: optional on read, so lines written before them stay valid."""


def _line_types() -> dict[type, type]:
    """msgspec Structs generated from the dataclasses above: same field names, types and (nested) defaults.
    Decoding into them is ~3x faster than into dataclasses. At the top level every field is required (a
    logged record carries all of them; the dataclass defaults are for writers) except those added within
    v1 (`OPTIONAL_FIELDS`), which older lines lack."""
    structs: dict[type, type] = {}
    for cls in (ModelId, Sampling, Beside, Step, AcceptanceRecord):  # a class after the classes it contains
        hints = typing.get_type_hints(cls)
        fields: list[tuple] = []
        for f in dataclasses.fields(cls):
            hint = _substitute(hints[f.name], structs)
            if (cls is AcceptanceRecord and f.name not in OPTIONAL_FIELDS) or f.default is dataclasses.MISSING:
                fields.append((f.name, hint))
            else:
                fields.append((f.name, hint, f.default))
        # v1 reads `sampling` strictly: an unknown sampling parameter could change what the record means.
        structs[cls] = msgspec.defstruct(f"{cls.__name__}Line", fields, forbid_unknown_fields=cls is Sampling)
    return structs


RecordLine = _line_types()[AcceptanceRecord]
"""A validated log line as read by `read_record`: the fields of `AcceptanceRecord`, no methods."""
_DECODER = msgspec.json.Decoder(RecordLine)


def read_record(line: str | bytes, vocab_size: int | None = None) -> Any:
    """Decode and validate one JSONL line into a `RecordLine` (for bulk readers such as mining);
    raise `RecordError` for anything malformed. Token ids must be < `vocab_size` (or `TOKEN_ID_LIMIT`).

    Well-formed lines take one msgspec pass. Anything it rejects is read again with the standard
    library (which also takes `NaN`, a BOM, `"schema_version": 1.0`) for the precise reason."""
    try:
        record = _DECODER.decode(line)
    except Exception:  # noqa: BLE001 - bad bytes may raise anything from the C decoder; the slow path says what
        record = _parse_slowly(line)
    check_record(record, vocab_size)
    return record


def parse_record(line: str | bytes, vocab_size: int | None = None) -> AcceptanceRecord:
    """`read_record`, as an `AcceptanceRecord`."""
    return msgspec.convert(read_record(line, vocab_size), AcceptanceRecord, from_attributes=True)


def _parse_slowly(line: str | bytes) -> Any:
    try:
        data = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RecordError(f"not JSON: {getattr(exc, 'msg', None) or exc}", "not_json") from exc
    except RecursionError as exc:  # absurdly deep nesting: malformed, not a crash
        raise RecordError("not JSON: nested too deeply", "not_json") from exc
    return record_from_dict(data)


def record_from_dict(data: Any) -> Any:
    """A decoded JSON object -> `RecordLine`, checking types (not invariants: `check_record`)."""
    if not isinstance(data, dict):
        raise RecordError(f"expected a JSON object, got {type(data).__name__}", "not_an_object")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION or isinstance(version, bool):
        raise RecordError(f"unknown schema_version {version!r} (this reader knows {SCHEMA_VERSION})",
                          "unknown_schema_version")
    try:
        return msgspec.convert({**data, "schema_version": SCHEMA_VERSION}, RecordLine)
    except msgspec.ValidationError as exc:
        raise _reason(str(exc)) from exc
    except (RecursionError, OverflowError, ValueError, TypeError) as exc:
        raise RecordError(f"invalid value: {type(exc).__name__}: {exc}", "wrong_type") from exc


def _reason(message: str) -> RecordError:
    """msgspec's "Expected `int`, got `str` - at `$.steps[0].k`" -> "field 'steps[0].k': expected ..."."""
    text, _, where = message.partition(" - at `$")
    path = where.rstrip("`").lstrip(".")
    if text.startswith("Object missing required field `"):
        name = text.split("`")[1]
        return RecordError(f"missing field {(path + '.' if path else '') + name!r}", "missing_field")
    kind = "bad_step" if path.startswith("steps[") else "wrong_type"
    return RecordError(f"field {path!r}: {text[:1].lower()}{text[1:]}", kind)


def check_record(record: Any, vocab_size: int | None = None) -> None:
    """Raise `RecordError` unless the counts, the step list and the token ids of a record (or
    `RecordLine`) agree: non-negative counts; `0 <= accepted <= k == len(draft_token_ids)` per step;
    `drafted_tokens`, `accepted_tokens` and `verify_steps` equal the step list's sums and length (a record
    from another engine, `source` set and no steps, carries that engine's totals instead); every token id
    in `[0, vocab_size)` (`[0, TOKEN_ID_LIMIT)` when the vocabulary size is unknown)."""
    for name in ("drafted_tokens", "accepted_tokens", "verify_steps"):
        if getattr(record, name) < 0:
            raise RecordError(f"out of range: field {name!r} = {getattr(record, name)}, must be >= 0", "out_of_range")
    if record.accepted_tokens > record.drafted_tokens:
        raise RecordError(f"inconsistent: accepted_tokens={record.accepted_tokens} > "
                          f"drafted_tokens={record.drafted_tokens}", "inconsistent")
    steps = record.steps
    for index, step in enumerate(steps):
        if not 0 <= step.accepted <= step.k == len(step.draft_token_ids):
            problem = (f"accepted={step.accepted} outside 0..k={step.k}" if not 0 <= step.accepted <= step.k
                       else f"{len(step.draft_token_ids)} draft_token_ids for k={step.k}")
            raise RecordError(f"steps[{index}]: {problem}", "bad_step")
        beside = step.beside
        if beside is not None and (not 0 <= beside.accepted <= min(beside.k, step.accepted)
                                   or beside.k != len(beside.draft_token_ids)):
            raise RecordError(f"steps[{index}].beside: accepted={beside.accepted} outside 0..min(k={beside.k}, "
                              f"the step's {step.accepted}), or {len(beside.draft_token_ids)} draft_token_ids",
                              "bad_step")
    totals = {"drafted_tokens": sum(s.k for s in steps), "accepted_tokens": sum(s.accepted for s in steps),
              "verify_steps": len(steps)}
    if record.source is not None and not steps:  # another engine's reported totals: nothing to sum them from
        totals = {}
        if record.drafted_tokens and not record.verify_steps:
            raise RecordError(f"inconsistent: drafted_tokens={record.drafted_tokens} in no verify step", "inconsistent")
    for name, expected in totals.items():
        if getattr(record, name) != expected:
            raise RecordError(f"inconsistent: field {name!r} = {getattr(record, name)} but the steps give {expected}",
                              "inconsistent")
    limit = vocab_size or TOKEN_ID_LIMIT
    _check_ids("prompt_token_ids", record.prompt_token_ids, limit)
    _check_ids("output_token_ids", record.output_token_ids, limit)
    besides = [t for s in steps if s.beside is not None for t in s.beside.draft_token_ids]
    if not _in_range([t for s in steps for t in s.draft_token_ids] + [s.target_token_id for s in steps] + besides,
                     limit):
        for index, step in enumerate(steps):  # find the culprit
            _check_ids(f"steps[{index}].draft_token_ids", step.draft_token_ids, limit)
            if step.beside is not None:
                _check_ids(f"steps[{index}].beside.draft_token_ids", step.beside.draft_token_ids, limit)
            _check_ids(f"steps[{index}].target_token_id", [step.target_token_id], limit)


def _in_range(ids: list[int], limit: int) -> bool:
    return not ids or (min(ids) >= 0 and max(ids) < limit)


def _check_ids(name: str, ids: list[int], limit: int) -> None:
    if not _in_range(ids, limit):
        bad = next(i for i, v in enumerate(ids) if not 0 <= v < limit)
        where = name if name.endswith("target_token_id") else f"{name}[{bad}]"
        raise RecordError(f"out of range: field {where!r} = {ids[bad]}, token ids must be in [0, {limit})",
                          "out_of_range")
