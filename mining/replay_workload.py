"""Replaying a prompt workload through the serving Engine so that it writes acceptance records.

`run_traffic(engine, workload, log_dir, params)` sends every prompt through the engine with the chat
template applied and the item's slice, and writes each request's `AcceptanceRecord` to a
`draftwheel.serving.engine.sink.JsonlSink` in `log_dir` (or leaves logging to the engine's own sink when `log_dir` is
None). It returns a per-slice summary. An `Engine` serves the prompts one at a time; a `BatchEngine`
(draftwheel.serving.engine.batching) takes them all at once, as `draftwheel serve` (continuous batching, its
default) would take that many concurrent clients, and the records are written in workload order. It does not build
workloads (`draftwheel.mining.workloads`) or models.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftwheel.serving.engine.acceptance import acceptance_rate, mean_accepted_length
from draftwheel.serving.engine.params import SamplingParams


def serving(engine: Any, max_batch: int) -> contextlib.AbstractContextManager:
    """What serves the traffic: `engine` itself, one request at a time, for `max_batch` 1, else a
    `BatchEngine` over it decoding up to `max_batch` requests at once (stopped on exit)."""
    if max_batch < 1:
        raise ValueError(f"max_batch: must be >= 1, got {max_batch}")
    if max_batch == 1:
        return contextlib.nullcontext(engine)
    from draftwheel.serving.engine.batching import BatchConfig, BatchEngine

    return BatchEngine(engine, BatchConfig(max_batch=max_batch))


def _summary(totals: list[int]) -> dict[str, Any]:
    requests, drafted, accepted, steps, generated = totals
    return {"requests": requests, "generated_tokens": generated,
            "acceptance_rate": acceptance_rate(accepted, drafted),
            "mean_accepted_length": mean_accepted_length(accepted, steps)}


def run_traffic(engine: Any, workload: list[dict[str, str]], log_dir: str | Path | None,
                params: SamplingParams | None = None, chat: bool = True, progress: bool = False) -> dict[str, Any]:
    """Generate every workload prompt; returns {"requests", "failed", "seconds", "by_slice", "log_dir"}."""
    from draftwheel.serving.engine.sink import JsonlSink

    serial = getattr(engine, "engine", engine)  # a BatchEngine's records go through its Engine
    if log_dir is not None and getattr(serial, "sink", None) is not None:
        raise ValueError("log_dir: the engine already writes to a sink; pass log_dir=None to use it")
    params = params or SamplingParams()
    sink = JsonlSink(log_dir) if log_dir is not None else None
    # per slice: requests, drafted, accepted, verify steps, generated tokens
    by_slice: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    failed: dict[str, int] = defaultdict(int)
    start = time.perf_counter()
    served = _completions(engine, workload, params, chat, failed)
    if progress:
        from tqdm import tqdm

        served = tqdm(served, total=len(workload), desc="traffic", unit="req")
    try:
        for item, completion in served:
            record = completion.record
            if sink is not None:
                sink.write(record)
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


def _completions(engine: Any, items: list[dict[str, str]], params: SamplingParams, chat: bool,
                 failed: dict[str, int]) -> Iterator[tuple[dict[str, str], Any]]:
    """(item, its Completion) in workload order; an item the engine refuses (e.g. a prompt longer than
    the model's context: ValueError) is counted in `failed` and skipped."""
    if not hasattr(engine, "submit"):  # one request at a time
        for item in items:
            try:
                yield item, engine.generate([item["prompt"]], params, slice=item["slice"], chat=chat)[0]
            except ValueError as exc:
                failed[type(exc).__name__] += 1
        return
    from draftwheel.serving.engine.scheduler import QueueFullError

    handles = []
    for item in items:  # all queued at once, waiting for room when the queue is full
        while True:
            try:
                handles.append((item, engine.submit(item["prompt"], params, slice=item["slice"], chat=chat)))
                break
            except QueueFullError:
                time.sleep(0.05)
            except ValueError as exc:
                failed[type(exc).__name__] += 1
                break
    for item, handle in handles:
        try:
            completion = list(handle.results())[-1]
        except ValueError as exc:
            failed[type(exc).__name__] += 1
            continue
        yield item, completion
