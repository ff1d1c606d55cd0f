"""Synthetic acceptance logs for tests and the mining benchmark: realistic sizes, consistent steps.

`synthetic_record(rng, ...)` builds one schema-v1 record as a dict: a prompt of 100-400 tokens, an
output of 64-128 tokens assembled from verification steps (k drafted, `accepted` of them emitted,
then the target's token), so the totals, steps and output ids agree the way the engine writes them.
Each slice has its own acceptance probability. `write_log` streams n records to a JSONL file.
Not used by the mining stage itself.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import msgspec

SLICE_ACCEPTANCE = {"code": 0.9, "prose": 0.75, "chat": 0.85}
_WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "ne", "po", "ru", "si", "ta", "vu", "ze")
          for b in ("bar", "con", "dex", "fin", "gor", "hul", "jan", "kil", "mon", "pex")]


def synthetic_record(rng: random.Random, index: int, ts: float, vocab: int = 384, k: int = 4,
                     slices: dict[str, float] | None = None) -> dict[str, Any]:
    slices = slices or SLICE_ACCEPTANCE
    name = rng.choice(sorted(slices))
    p = slices[name] * rng.uniform(0.6, 1.2)  # per-request difficulty around the slice's mean
    prompt_len, output_len = rng.randint(100, 400), rng.randint(64, 128)
    steps, output = [], []
    while len(output) < output_len:
        draft = [rng.randrange(vocab) for _ in range(k)]
        accepted = 0
        while accepted < k and rng.random() < p:
            accepted += 1
        target = rng.randrange(vocab)
        if accepted < k and target == draft[accepted]:
            target = (target + 1) % vocab
        output.extend(draft[:accepted] + [target])
        steps.append({"k": k, "accepted": accepted, "draft_token_ids": draft, "target_token_id": target})
    words = rng.choices(_WORDS, k=prompt_len * 3 // 4)
    return {
        "schema_version": 1, "request_id": f"req-{index:09d}", "ts": ts, "slice": name,
        "target_id": {"name": "synthetic-target", "version": "1", "sha256": "0" * 64},
        "draft_id": {"name": "synthetic-draft", "version": "1", "sha256": "1" * 64},
        "mode": "draft", "sampling": {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "seed": None},
        "prompt": f"<|im_start|>user\n{name} task {index % 50000}: {' '.join(words)}<|im_end|>\n<|im_start|>assistant\n",
        "prompt_token_ids": [rng.randrange(vocab) for _ in range(prompt_len)],
        "output": " ".join(rng.choices(_WORDS, k=len(output) * 3 // 4)), "output_token_ids": output,
        "finish_reason": "length", "steps": steps, "drafted_tokens": k * len(steps),
        "accepted_tokens": sum(s["accepted"] for s in steps), "verify_steps": len(steps),
        "ttft_s": 0.02, "latency_s": 0.5,
    }


def write_log(path: Path, n: int, seed: int = 0, start_ts: float = 1.7e9, vocab: int = 384,
              bad_every: int = 0) -> Path:
    """Write n records (plus a not-JSON line every `bad_every` records, if > 0) to `path`."""
    rng = random.Random(seed)
    encoder = msgspec.json.Encoder()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb", buffering=1 << 20) as handle:
        for i in range(n):
            handle.write(encoder.encode(synthetic_record(rng, i, start_ts + i * 0.01, vocab)) + b"\n")
            if bad_every and i % bad_every == bad_every - 1:
                handle.write(b'{"schema_version": 1, "request_id": "cut-off\n')
    return path
