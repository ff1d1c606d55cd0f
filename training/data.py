"""Training inputs: the mined datasets on disk turned into padded token batches.

Reads the `distill/` and `holdout/` datasets that `mining` writes (columns in docs/architecture.md),
builds `input_ids` = prompt + completion with a `loss_mask` aligned to the *logits* positions (position
`t` is counted when token `t + 1` is a completion token, so only completion tokens are learned), and
pads them in a collator. It also builds and reads the optional on-disk cache of the teacher's top-k
log-probs. It does not tokenize text: mining already stored the token ids the target saw.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


class DatasetError(ValueError):
    """A dataset directory is missing or lacks the columns this stage needs."""


def load_dataset_dir(path: str | Path, columns: tuple[str, ...]) -> Any:
    """`datasets.load_from_disk(path)`, checking the needed columns are there."""
    from datasets import load_from_disk

    path = Path(path)
    if not path.is_dir():
        raise DatasetError(f"dataset {path} does not exist (run `draftwheel mine` first)")
    dataset = load_from_disk(str(path))
    missing = [c for c in columns if c not in dataset.column_names]
    if missing:
        raise DatasetError(f"dataset {path} lacks column(s) {', '.join(missing)}; has {dataset.column_names}")
    if len(dataset) == 0:
        raise DatasetError(f"dataset {path} is empty")
    return dataset


def join_and_truncate(prompt: list[int], completion: list[int], max_length: int) -> tuple[list[int], int]:
    """prompt + completion within `max_length` tokens -> (ids, prompt length).

    The prompt is cut from the left (its end matters most for the next token) down to half the budget,
    then the completion is cut from the right.
    """
    keep_prompt = max(max_length - len(completion), max_length // 2)
    prompt = prompt[-keep_prompt:] if len(prompt) > keep_prompt else prompt
    ids = (list(prompt) + list(completion))[:max_length]
    return ids, len(prompt)


def loss_mask_for(n_tokens: int, prompt_len: int) -> list[int]:
    """1 at logits positions that predict a completion token (positions prompt_len-1 .. n-2)."""
    start = max(prompt_len - 1, 0)
    return [1 if start <= t < n_tokens - 1 else 0 for t in range(n_tokens)]


TEACHER_COLUMNS = ("teacher_topk_values", "teacher_topk_indices")


def has_teacher_topk(dataset: Any) -> bool:
    """True when rows carry the target's top-k log-probs per completion token (see draftwheel.training.target_completions)."""
    return all(c in dataset.column_names for c in TEACHER_COLUMNS)


def _align_topk(per_completion: list[list[Any]], n_tokens: int, prompt_len: int, fill: Any) -> list[list[Any]]:
    """Per-completion-token top-k -> per-logits-position rows: position prompt_len - 1 + j holds token j's."""
    k = len(per_completion[0])
    start = max(prompt_len - 1, 0)
    rows = [[fill] * k for _ in range(n_tokens)]
    for j, values in enumerate(per_completion[: max(n_tokens - 1 - start, 0)]):
        rows[start + j] = list(values)
    return rows


def tokenize_distill(dataset: Any, max_length: int, use_weights: bool = True, with_teacher: bool = False,
                     prompt_loss: bool = False) -> Any:
    """Map a `distill/` dataset to `input_ids`, `loss_mask`, `weight` rows (other columns dropped).

    `with_teacher` also keeps the rows' cached teacher top-k, aligned to the logits positions;
    `prompt_loss` counts prompt positions too (more teacher signal per sequence; needs a full teacher).
    """

    def encode(row: dict[str, Any]) -> dict[str, Any]:
        ids, prompt_len = join_and_truncate(row["prompt_token_ids"], row["completion_token_ids"], max_length)
        weight = float(row.get("weight", 1.0)) if use_weights else 1.0
        mask = loss_mask_for(len(ids), 1 if prompt_loss else prompt_len)
        out = {"input_ids": ids, "loss_mask": mask, "weight": weight}
        if with_teacher:
            out["teacher_topk_values"] = _align_topk(row["teacher_topk_values"], len(ids), prompt_len, 0.0)
            out["teacher_topk_indices"] = _align_topk(row["teacher_topk_indices"], len(ids), prompt_len, 0)
        return out

    encoded = dataset.map(encode, remove_columns=dataset.column_names, desc="tokenize distill")
    return encoded.filter(lambda row: sum(row["loss_mask"]) > 0, desc="drop empty completions")


def _pad(rows: list[list[Any]], value: Any, dtype: torch.dtype) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [value] * (width - len(r)) for r in rows], dtype=dtype)


@dataclass
class DistillCollator:
    """Right-pads `input_ids`/`loss_mask` (and cached teacher top-k, when present) into tensors."""

    pad_token_id: int

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        ids = [r["input_ids"] for r in rows]
        batch = {
            "input_ids": _pad(ids, self.pad_token_id, torch.long),
            "attention_mask": _pad([[1] * len(r) for r in ids], 0, torch.long),
            "loss_mask": _pad([r["loss_mask"] for r in rows], 0, torch.bool),
            "weight": torch.tensor([float(r.get("weight", 1.0)) for r in rows]),
        }
        if "teacher_topk_values" in rows[0]:
            k = len(rows[0]["teacher_topk_values"][0])
            batch["teacher_topk_values"] = _pad([r["teacher_topk_values"] for r in rows], [0.0] * k, torch.float)
            batch["teacher_topk_indices"] = _pad([r["teacher_topk_indices"] for r in rows], [0] * k, torch.long)
        return batch


def cache_key(dataset: Any, teacher_sha256: str, top_k: int, max_length: int) -> str:
    """Identifies a teacher cache: same data, same teacher weights, same k -> same cache."""
    payload = json.dumps([dataset._fingerprint, teacher_sha256, top_k, max_length])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def build_teacher_cache(teacher: Any, encoded: Any, top_k: int, cache_dir: Path, batch_size: int = 4,
                        pad_token_id: int = 0) -> Any:
    """Add the teacher's top-k log-probs per position to `encoded`, saved under `cache_dir` (reused if there)."""
    from datasets import load_from_disk
    from tqdm.auto import tqdm

    if (cache_dir / "dataset_info.json").is_file():
        return load_from_disk(str(cache_dir))
    collate = DistillCollator(pad_token_id)
    values, indices = [], []
    device = next(teacher.parameters()).device
    for start in tqdm(range(0, len(encoded), batch_size), desc="teacher top-k cache"):
        rows = [encoded[i] for i in range(start, min(start + batch_size, len(encoded)))]
        batch = collate(rows)
        with torch.no_grad():
            logits = teacher(input_ids=batch["input_ids"].to(device),
                             attention_mask=batch["attention_mask"].to(device)).logits
            top = torch.log_softmax(logits.float(), dim=-1).topk(top_k, dim=-1)
        for row_index, row in enumerate(rows):
            n = len(row["input_ids"])
            values.append(top.values[row_index, :n].cpu().tolist())
            indices.append(top.indices[row_index, :n].cpu().tolist())
    cached = encoded.add_column("teacher_topk_values", values).add_column("teacher_topk_indices", indices)
    cached.save_to_disk(str(cache_dir))
    return load_from_disk(str(cache_dir))


@dataclass
class HoldoutExample:
    """One hold-out request: what the target was given and what it produced."""

    prompt_ids: list[int]
    output_ids: list[int]
    slice: str = "default"


def load_holdout(path: str | Path, max_samples: int = 0, max_length: int = 512) -> list[HoldoutExample]:
    """Read a `holdout/` dataset (prompt_token_ids, output_token_ids[, slice]) into examples."""
    dataset = load_dataset_dir(path, ("prompt_token_ids", "output_token_ids"))
    if max_samples:
        dataset = dataset.select(range(min(max_samples, len(dataset))))
    examples = []
    for row in dataset:
        ids, prompt_len = join_and_truncate(row["prompt_token_ids"], row["output_token_ids"], max_length)
        if len(ids) > prompt_len:
            examples.append(HoldoutExample(ids[:prompt_len], ids[prompt_len:], row.get("slice", "default")))
    if not examples:
        raise DatasetError(f"holdout {path} has no example with output tokens")
    return examples
