"""Synthetic acceptance logs for tests and the mining benchmark: realistic sizes, consistent steps.

`synthetic_record(rng, ...)` builds one schema-v1 record with `draftwheel.serving.engine.records` (the schema's one
definition; totals are computed from the steps as the engine does) and returns its JSON object as a
dict, so tests can override fields: a prompt of 100-400 tokens, an output of 64-128 tokens assembled
from verification steps (k drafted, `accepted` of them emitted, then the target's token).
Each slice has its own acceptance probability per drafted token. `write_log` streams n records to a
JSONL file. Random draws are vectorised with numpy so a million records take minutes, not hours.
Not used by the mining stage itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from draftwheel.serving.engine.records import AcceptanceRecord, ModelId, Sampling, Step

SLICE_ACCEPTANCE = {"chat": 0.85, "code": 0.9, "prose": 0.75}
_WORDS = np.array([f"{a}{b}" for a in ("ka", "lo", "mi", "ne", "po", "ru", "si", "ta", "vu", "ze")
                   for b in ("bar", "con", "dex", "fin", "gor", "hul", "jan", "kil", "mon", "pex")])


def _steps(rng: np.random.Generator, p: float, k: int, vocab: int, output_len: int) -> tuple[list[Step], list[int]]:
    count = output_len  # upper bound: every step emits at least one token
    accepted = np.cumprod(rng.random((count, k)) < p, axis=1).sum(axis=1)
    drafts = rng.integers(0, vocab, (count, k))
    targets = rng.integers(0, vocab, count)
    rows = np.arange(count)
    clash = (accepted < k) & (targets == drafts[rows, np.minimum(accepted, k - 1)])
    targets[clash] = (targets[clash] + 1) % vocab  # the target's token differs from the rejected draft
    steps, output = [], []
    for taken, draft, target in zip(accepted.tolist(), drafts.tolist(), targets.tolist()):
        output += draft[:taken] + [target]
        steps.append(Step(k=k, accepted=taken, draft_token_ids=draft, target_token_id=target))
        if len(output) >= output_len:
            break
    return steps, output


def synthetic_record(rng: np.random.Generator, index: int, ts: float, vocab: int = 384, k: int = 4,
                     slices: dict[str, float] | None = None) -> dict[str, Any]:
    slices = slices or SLICE_ACCEPTANCE
    names = sorted(slices)
    name = names[int(rng.integers(len(names)))]
    p = min(0.99, slices[name] * float(rng.uniform(0.6, 1.2)))  # per-request difficulty around the slice's mean
    prompt_len, output_len = int(rng.integers(100, 401)), int(rng.integers(64, 129))
    steps, output = _steps(rng, p, k, vocab, output_len)
    words = " ".join(_WORDS[rng.integers(0, len(_WORDS), prompt_len * 3 // 4)].tolist())
    return AcceptanceRecord(
        request_id=f"req-{index:09d}", ts=ts, slice=name, target_id=ModelId("synthetic-target", "1", "0" * 64),
        draft_id=ModelId("synthetic-draft", "1", "1" * 64), mode="draft", sampling=Sampling(),
        prompt=f"<|im_start|>user\n{name} task {index % 50000}: {words}<|im_end|>\n<|im_start|>assistant\n",
        prompt_token_ids=rng.integers(0, vocab, prompt_len).tolist(),
        output=" ".join(_WORDS[rng.integers(0, len(_WORDS), len(output) * 3 // 4)].tolist()),
        output_token_ids=output, finish_reason="length", steps=steps, drafted_tokens=sum(s.k for s in steps),
        accepted_tokens=sum(s.accepted for s in steps), verify_steps=len(steps), ttft_s=0.02, latency_s=0.5,
    ).to_dict()


def write_log(path: Path, n: int, seed: int = 0, start_ts: float = 1.7e9, vocab: int = 384,
              bad_every: int = 0) -> Path:
    """Write n records (plus a not-JSON line every `bad_every` records, if > 0) to `path`."""
    rng = np.random.default_rng(seed)
    encoder = msgspec.json.Encoder()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb", buffering=1 << 20) as handle:
        for i in range(n):
            handle.write(encoder.encode(synthetic_record(rng, i, start_ts + i * 0.01, vocab)) + b"\n")
            if bad_every and i % bad_every == bad_every - 1:
                handle.write(b'{"schema_version": 1, "request_id": "cut-off\n')
    return path
