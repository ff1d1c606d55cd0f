"""Replaying a prompt workload through the serving Engine so that it writes acceptance records.

`run_traffic(engine, workload, log_dir, params)` sends every prompt through `engine.generate` with the
chat template applied and the item's slice, and writes each request's `AcceptanceRecord` to a
`draftwheel.serving.engine.sink.JsonlSink` in `log_dir` (or leaves logging to the engine's own sink when `log_dir` is
None). It returns a per-slice summary. It does not build workloads (`draftwheel.mining.workloads`) or models.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from draftwheel.serving.engine.acceptance import acceptance_rate, mean_accepted_length
from draftwheel.serving.engine.params import SamplingParams


def _summary(totals: list[int]) -> dict[str, Any]:
    requests, drafted, accepted, steps, generated = totals
    return {"requests": requests, "generated_tokens": generated,
            "acceptance_rate": acceptance_rate(accepted, drafted),
            "mean_accepted_length": mean_accepted_length(accepted, steps)}


def run_traffic(engine: Any, workload: list[dict[str, str]], log_dir: str | Path | None,
                params: SamplingParams | None = None, chat: bool = True, progress: bool = False) -> dict[str, Any]:
    """Generate every workload prompt; returns {"requests", "failed", "seconds", "by_slice", "log_dir"}."""
    from draftwheel.serving.engine.sink import JsonlSink

    if log_dir is not None and getattr(engine, "sink", None) is not None:
        raise ValueError("log_dir: the engine already writes to a sink; pass log_dir=None to use it")
    params = params or SamplingParams()
    sink = JsonlSink(log_dir) if log_dir is not None else None
    # per slice: requests, drafted, accepted, verify steps, generated tokens
    by_slice: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    failed: dict[str, int] = defaultdict(int)
    items = workload
    if progress:
        from tqdm import tqdm

        items = tqdm(workload, desc="traffic", unit="req")
    start = time.perf_counter()
    try:
        for item in items:
            try:
                completion = engine.generate([item["prompt"]], params, slice=item["slice"], chat=chat)[0]
            except ValueError as exc:  # e.g. a prompt longer than the model's context: skip it, count it
                failed[type(exc).__name__] += 1
                continue
            if sink is not None:
                sink.write(completion.record)
            record = completion.record
            totals = by_slice[item["slice"]]
            for i, value in enumerate((1, record.drafted_tokens, record.accepted_tokens, record.verify_steps,
                                       len(record.output_token_ids))):
                totals[i] += value
    finally:
        if sink is not None:
            sink.close()
    return {"requests": sum(v[0] for v in by_slice.values()), "failed": dict(failed),
            "seconds": round(time.perf_counter() - start, 3), "log_dir": str(log_dir) if log_dir else None,
            "write_errors": getattr(sink, "write_errors", 0),
            "by_slice": {name: _summary(totals) for name, totals in sorted(by_slice.items())}}
