"""Target features for EAGLE-3 training, computed once and cached on disk.

One batched, teacher-forced target forward per group of sequences gives, for every position: the
inputs of the aux layers (what the draft reads, [3*H]), the final normed hidden state (the teacher's
distribution over any draft vocabulary is `lm_head(hidden)` restricted to it, so the cache does not
depend on the vocabulary) and the target's argmax (the greedy reference). Stored in half precision,
one file per sequence under a key of (its tokens, target weights sha256, aux layer ids, bf16), so
epochs, later runs on the same data and later rounds whose retained corpus holds the same sequences
reuse them. It does not train anything.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
from safetensors.torch import load_file, save_file

from draftwheel.serving.engine.sampling import greedy
from draftwheel.training.cache_budget import touch

ROWS_DIR = "rows"  # one safetensors file per sequence under the cache root
TOKENS_PER_BATCH = 2048  # padded tokens per target forward


@dataclass
class Features:
    """Flat per-token arrays for n sequences; sequence i spans offsets[i]:offsets[i+1]."""

    aux: torch.Tensor        # [N, 3H] float16
    hidden: torch.Tensor     # [N, H] float16
    argmax: torch.Tensor     # [N] int64
    offsets: torch.Tensor    # [n+1] int64

    def sequence(self, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.aux[a:b], self.hidden[a:b], self.argmax[a:b]


def join_features(parts: list[Features]) -> Features:
    """Features of several sequence lists, as one for the lists concatenated."""
    starts = torch.tensor([0] + [int(p.offsets[-1]) for p in parts]).cumsum(0)
    return Features(aux=torch.cat([p.aux for p in parts]), hidden=torch.cat([p.hidden for p in parts]),
                    argmax=torch.cat([p.argmax for p in parts]),
                    offsets=torch.cat([starts[:1]] + [p.offsets[1:] + s for p, s in zip(parts, starts)]))


def row_key(sequence: list[int], target_sha256: str, aux_layer_ids: list[int], bf16: bool = False) -> str:
    digest = hashlib.sha256(json.dumps([sequence, target_sha256, aux_layer_ids, bf16]).encode())
    return digest.hexdigest()[:32]


def row_path(cache_root: Path, sequence: list[int], target_sha256: str, aux_layer_ids: list[int],
             bf16: bool = False) -> Path:
    """Where one sequence's feature row is cached (`row_key`)."""
    return cache_root / ROWS_DIR / f"{row_key(sequence, target_sha256, aux_layer_ids, bf16)}.safetensors"


def store_row(path: Path, row: tuple[torch.Tensor, torch.Tensor, torch.Tensor]) -> None:
    """Write one sequence's (aux, hidden, argmax) atomically: a crash mid-write never leaves a truncated row."""
    aux, hidden, argmax = row
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({"aux": aux.clone(), "hidden": hidden.clone(), "argmax": argmax.clone()}, str(tmp))
    tmp.replace(path)


def feature_row(states: tuple[torch.Tensor, ...], aux_layer_ids: list[int],
                argmax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One sequence's (aux, hidden, argmax) from per-layer [n, H] hidden states: `aux_layer_ids` index
    into `states`, and states[-1] is the final norm's output (in HF Llama-family models lm_head(it) ==
    logits). `_forward` passes every layer, embeddings first; `row_from_states` only the kept ones."""
    aux = torch.cat([states[i] for i in aux_layer_ids], -1)
    return aux.half().cpu(), states[-1].half().cpu(), argmax.cpu()


def row_from_states(target: Any, states: tuple[torch.Tensor, ...], n: int, aux_layer_ids: list[int],
                    chosen: Sequence[int] = (), chosen_from: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A feature row from hidden states a forward pass already produced (e.g. generation's), for the
    first n positions. The argmax comes from the target's head over the final states, except at the
    positions from `chosen_from` on where greedy generation already took it: `chosen` are the tokens it
    chose there, so the head over the whole vocabulary does not run twice for them."""
    states = tuple(layer[:n] for layer in states)
    end = min(n, chosen_from + len(chosen))
    with torch.inference_mode():
        head = target.get_output_embeddings()

        def scored(part: torch.Tensor) -> list[torch.Tensor]:
            return [greedy(head(chunk.to(head.weight.dtype))) for chunk in part.split(512)]

        known = torch.tensor(list(chosen[:end - chosen_from]), dtype=torch.long, device=states[-1].device)
        argmax = torch.cat([*scored(states[-1][:chosen_from]), known, *scored(states[-1][end:])])
    return feature_row(states, aux_layer_ids, argmax)


def _forward(target: Any, batch: list[list[int]], aux_layer_ids: list[int], bf16: bool):
    width = max(len(s) for s in batch)
    ids = torch.tensor([s + [0] * (width - len(s)) for s in batch])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in batch])
    device = next(target.parameters()).device
    with torch.inference_mode(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        out = target(input_ids=ids.to(device), attention_mask=mask.to(device), output_hidden_states=True)
    for row, seq in enumerate(batch):
        n = len(seq)
        yield feature_row(tuple(layer[row, :n] for layer in out.hidden_states), aux_layer_ids,
                          greedy(out.logits[row, :n]))


def compute_features(target: Any, sequences: list[list[int]], aux_layer_ids: list[int], progress: bool = True,
                     bf16: bool = False, known: dict[int, tuple] | None = None) -> Features:
    """Teacher-forced target forwards over `sequences`, batched by length (about TOKENS_PER_BATCH each).
    With `bf16`, under bfloat16 autocast (several times faster on CPUs with AMX; the features are
    stored in half precision anyway). `known` holds rows some earlier pass already produced (sequence
    index -> feature_row); those sequences are not run again."""
    from tqdm import tqdm

    results: dict[int, tuple] = dict(known or {})
    order = sorted((i for i in range(len(sequences)) if i not in results), key=lambda i: len(sequences[i]))
    batch: list[int] = []
    bar = tqdm(total=sum(len(sequences[i]) for i in order), desc="target features", unit="tok",
               disable=not progress)

    def flush() -> None:
        for i, row in zip(batch, _forward(target, [sequences[i] for i in batch], aux_layer_ids, bf16)):
            results[i] = row
            bar.update(len(sequences[i]))
        batch.clear()

    for i in order:
        if batch and len(sequences[i]) * (len(batch) + 1) > TOKENS_PER_BATCH:
            flush()
        batch.append(i)
    if batch:
        flush()
    bar.close()
    lengths = torch.tensor([0] + [len(s) for s in sequences])
    return Features(aux=torch.cat([results[i][0] for i in range(len(sequences))]),
                    hidden=torch.cat([results[i][1] for i in range(len(sequences))]),
                    argmax=torch.cat([results[i][2] for i in range(len(sequences))]),
                    offsets=lengths.cumsum(0))


def cached_features(target: Any, sequences: list[list[int]], aux_layer_ids: list[int], target_sha256: str,
                    cache_root: Path, progress: bool = True, bf16: bool = False,
                    known: dict[int, tuple] | None = None) -> tuple[Features, float]:
    """Features, each sequence's row read from `cache_root/rows/` where stored, else taken from `known`
    or computed, and stored. Per sequence, so a set that shares sequences with an earlier one (a round's
    corpus rows, a rehearsal sample) runs the target over the new ones alone. Returns (features, the
    share of sequences read from the cache)."""
    paths = [row_path(cache_root, s, target_sha256, aux_layer_ids, bf16) for s in sequences]
    rows = dict(known or {})
    read = {i for i, path in enumerate(paths) if i not in rows and path.is_file()}
    for i in read:
        stored = load_file(str(paths[i]))
        touch(paths[i])  # recently used: kept longest under the cache's budget
        rows[i] = (stored["aux"], stored["hidden"], stored["argmax"])
    features = compute_features(target, sequences, aux_layer_ids, progress, bf16, rows)
    for i in (i for i in range(len(sequences)) if i not in read):  # computed here or given as `known`
        store_row(paths[i], features.sequence(i))
    return features, len(read) / len(sequences) if sequences else 1.0
