"""Building and writing the output datasets: distill/, preference/, holdout/ (Hugging Face `datasets`).

Rows are built from full records (`distill_row`, `preference_rows`, `holdout_row`) and streamed into
an Arrow file in batches (`DatasetWriter`), then saved with `save_to_disk`, so memory is bounded by
the batch size. Text is PII-scrubbed by `TextPrep`, which keeps token ids consistent with the text:
when scrubbing changes a text, its ids are re-derived with the target's tokenizer; without a
tokenizer such a text cannot be written consistently and the row is skipped (the caller leaves
those requests out beforehand). A record from another engine without token ids gets them the same way. Preference pairs need the tokenizer to turn single tokens into text.
"""

from __future__ import annotations

import itertools
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
from datasets import Dataset, Features, List, Value

from draftwheel.hashing import tree_sha256
from draftwheel.mining.pii import Scrubber, contains_pii
from draftwheel.mining.residual import served_residual

_IDS = List(Value("int32"))
DISTILL = Features({"prompt": Value("string"), "completion": Value("string"), "prompt_token_ids": _IDS,
                    "completion_token_ids": _IDS, "slice": Value("string"), "weight": Value("float32"),
                    "served_residual": List(Value("float32"))})
PREFERENCE = Features({"prompt": Value("string"), "chosen": Value("string"), "rejected": Value("string"),
                       "prompt_token_ids": _IDS, "chosen_token_ids": _IDS, "rejected_token_ids": _IDS,
                       "slice": Value("string")})
HOLDOUT = Features({"request_id": Value("string"), "prompt": Value("string"), "prompt_token_ids": _IDS,
                    "slice": Value("string"), "max_new_tokens": Value("int32"), "output_token_ids": _IDS})
BATCH = 512
TAIL_CHECK = 256  # characters of a preference prefix re-checked for PII
MIN_PII_CHARS = 6


class TextPrep:
    """Scrub a text; keep its ids if unchanged, re-tokenise if changed, give up (None) without a tokenizer."""

    def __init__(self, scrubber: Scrubber | None, tokenizer: Any = None):
        self.scrubber = scrubber
        self.tokenizer = tokenizer

    def scrub(self, text: str) -> str:
        return self.scrubber.scrub(text) if self.scrubber is not None else text

    def text_and_ids(self, text: str, ids: list[int]) -> tuple[str, list[int]] | None:
        """(scrubbed text, its ids). Ids a record lacks (another engine's, which did not return them) are
        derived from the text like those of a scrubbed one."""
        clean = self.scrub(text)
        if clean == text and (ids or not text):
            return text, list(ids)
        if self.tokenizer is None:
            return None
        return clean, self.tokenizer(clean, add_special_tokens=False)["input_ids"]

    def decode_many(self, sequences: list[list[int]]) -> list[str]:
        """Decode several id lists at once (one Rust call with a fast tokenizer; no clean-up of spaces)."""
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is not None:
            return backend.decode_batch(sequences, skip_special_tokens=False)
        return [self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
                for ids in sequences]


def distill_row(record: Any, prep: TextPrep, weight: float) -> dict[str, Any] | None:
    prompt = prep.text_and_ids(record.prompt, record.prompt_token_ids)
    completion = prep.text_and_ids(record.output, record.output_token_ids)
    if prompt is None or completion is None:
        return None
    # Per completion token, what the served stack missed (draftwheel.mining.residual); a completion re-tokenised by
    # the PII scrub no longer lines up with the logged steps, so all of it counts.
    residual = served_residual(record) if completion[1] == list(record.output_token_ids) else [1.0] * len(completion[1])
    return {"prompt": prompt[0], "completion": completion[0], "prompt_token_ids": prompt[1],
            "completion_token_ids": completion[1], "slice": record.slice, "weight": weight,
            "served_residual": residual}


def holdout_row(record: Any, prep: TextPrep) -> dict[str, Any] | None:
    prompt = prep.text_and_ids(record.prompt, record.prompt_token_ids)
    output = prep.text_and_ids(record.output, record.output_token_ids)
    if prompt is None or output is None:
        return None
    # The log has no max_new_tokens; replaying with the served length reproduces the request's budget.
    return {"request_id": record.request_id, "prompt": prompt[0], "prompt_token_ids": prompt[1],
            "slice": record.slice, "max_new_tokens": max(1, len(output[1])),
            "output_token_ids": output[1]}


def rejections(record: Any) -> Iterator[tuple[int, int, int]]:
    """(output position of the rejection, target token, rejected draft token) per rejecting step.

    Stops at the first step that does not line up with the output (e.g. a stop string cut it)."""
    out = record.output_token_ids
    position = 0
    for step in record.steps:
        taken = step.accepted
        at = position + taken
        aligned = out[position:at] == step.draft_token_ids[:taken] and (at == len(out) or out[at] == step.target_token_id)
        if not aligned or at > len(out):
            return
        if taken < step.k and taken < len(step.draft_token_ids) and step.draft_token_ids[taken] != step.target_token_id:
            yield at, step.target_token_id, step.draft_token_ids[taken]
        position = at + 1


def preference_rows(record: Any, prep: TextPrep, max_pairs: int) -> Iterator[dict[str, Any]]:
    """TRL DPO rows: prompt = prompt + accepted prefix, chosen = target token, rejected = draft token."""
    prompt = prep.text_and_ids(record.prompt, record.prompt_token_ids)
    if prompt is None or prep.tokenizer is None:
        return
    # Take a few spare rejections: pairs whose text scrubbing would change are skipped below.
    spots = list(itertools.islice(rejections(record), 2 * max_pairs))
    if not spots:
        return
    out = record.output_token_ids
    texts = prep.decode_many([out[:at] for at, _, _ in spots] + [[t] for _, c, r in spots for t in (c, r)])
    # Matches are local: if the whole output is clean, a prefix of it can only gain a match where it was
    # cut, so its tail is all that needs checking. Otherwise check each prefix whole.
    tail = TAIL_CHECK if prep.scrubber is not None and not contains_pii(record.output) else None
    pairs = 0
    for i, (at, chosen_id, rejected_id) in enumerate(spots):
        if pairs >= max_pairs:
            return
        prefix, chosen, rejected = texts[i], texts[len(spots) + 2 * i], texts[len(spots) + 2 * i + 1]
        # A prefix or token that scrubbing would change no longer matches its ids: skip that pair.
        # A single token shorter than the shortest PII pattern (an e-mail like a@b.cd) needs no check.
        checks = [prefix[-tail:] if tail else prefix] + [t for t in (chosen, rejected) if len(t) >= MIN_PII_CHARS]
        if prep.scrubber is not None and any(contains_pii(t) for t in checks):
            continue
        pairs += 1
        yield {"prompt": prompt[0] + prefix, "chosen": chosen, "rejected": rejected,
               "prompt_token_ids": prompt[1] + list(out[:at]), "chosen_token_ids": [chosen_id],
               "rejected_token_ids": [rejected_id], "slice": record.slice}


class DatasetWriter:
    """Streams rows into an Arrow file in batches; `save(dir)` writes the `save_to_disk` dataset."""

    def __init__(self, features: Features, scratch: Path):
        self.features = features
        self.scratch = scratch
        self.rows = 0
        self._pending: list[dict[str, Any]] = []
        self._sink = pa.OSFile(str(scratch), "wb")
        self._writer = pa.ipc.new_stream(self._sink, features.arrow_schema)

    def add(self, row: dict[str, Any] | None) -> None:
        if row is None:
            return
        self._pending.append(row)
        if len(self._pending) >= BATCH:
            self._write()

    def _write(self) -> None:
        if self._pending:
            self._writer.write_batch(pa.RecordBatch.from_pylist(self._pending, schema=self.features.arrow_schema))
            self.rows += len(self._pending)
            self._pending = []

    def save(self, out_dir: Path) -> int:
        self._write()
        self._writer.close()
        self._sink.close()
        if out_dir.exists():  # a previous run's shards must not survive next to this run's
            shutil.rmtree(out_dir)
        # An empty dataset saved with zero shards cannot be loaded again: force one shard.
        Dataset.from_file(str(self.scratch)).save_to_disk(str(out_dir), num_shards=1 if self.rows == 0 else None)
        return self.rows


def path_sha256(path: Path) -> str:
    """sha256 of a file, or of a directory's files (sorted relative paths and their bytes, without the
    `datasets` fingerprint file, so identical data gives an identical digest)."""
    return tree_sha256([path])
