"""What a request costs as served: a cost model in units of one plain decoding step.

A verification step that checks n drafted tokens runs one target forward over n + 1 rows; on a CPU
that costs more than a 1-row step, by an amount that depends on the machine and the dtype (on an AMX
Xeon in bfloat16 a 5-row verify costs ~1.1 plain steps, on an AVX2 EPYC in float32 ~1.5). A draft model
adds c per token it drafts (c: its per-token time over one plain step); the suffix index's proposals
cost nothing measurable. So one request's modelled speed against plain decoding is

    served_speedup = tokens its steps emitted / sum over steps of (cost(k + 1 rows) + c * model-drafted k)

where plain decoding costs exactly one unit per token. The figure is a pure function of the logged
steps and two measured constants, so two drafts replayed on the same prompts are compared without the
timing noise of each request's wall clock (which `draftwheel.evaluation.shadow` reports beside it).

`measure_row_costs` times the target; `StepCost` summarizes a record's steps; `served_speedup` applies
the model; `modelled_time` turns it into the step times a replay may decide by. It does not decode or
decide anything.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Iterable

import torch

from draftwheel.serving.engine.acceptance import draft_cost_ratio
from draftwheel.serving.engine.adaptive import ModelledTime
from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.records import MODEL_SOURCES, verify_rows


@torch.inference_mode()
def measure_row_costs(model: Any, max_rows: int, context: int = 128, reps: int = 5) -> tuple[list[float], float]:
    """([1.0, cost(2 rows), ..., cost(max_rows rows)], seconds of a 1-row forward): the median time of a
    verify forward of n rows on a `context`-token cache, over the median time of a 1-row forward. The
    widths are timed in turn, one forward each per round, so a change in machine load mid-measurement
    touches every width alike instead of the widths timed after it. Costs are made non-decreasing (a
    forward over more rows never costs less; a dip is timing noise)."""
    device = next(model.parameters()).device
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(0)
    lm = CachedLM(model)
    lm.forward(torch.randint(0, vocab, (context,), generator=generator).to(device), keep=1)
    inputs = [torch.randint(0, vocab, (rows,), generator=generator).to(device) for rows in range(1, max_rows + 1)]

    def timed(ids: torch.Tensor) -> float:
        start = time.perf_counter()
        lm.forward(ids, keep=len(ids))
        elapsed = time.perf_counter() - start
        lm.rollback(len(ids))
        return elapsed

    for ids in inputs:  # warm each width's kernels
        timed(ids)
    times: list[list[float]] = [[] for _ in inputs]
    for _ in range(reps):
        for width, ids in enumerate(inputs):
            times[width].append(timed(ids))
    seconds = [statistics.median(t) for t in times]
    costs = [s / seconds[0] for s in seconds]
    for i in range(1, len(costs)):
        costs[i] = max(costs[i], costs[i - 1])
    costs[0] = 1.0
    return costs, seconds[0]


@dataclass
class StepCost:
    """One request's steps, summarized for the cost model."""

    tokens: int
    """Tokens the verification steps emitted (accepted + the target's own token, per step)."""
    verify_cost: float
    """Sum over steps of the cost of a verify over k + 1 rows, `row_costs[k]` (plain steps: 1; a token
    tree's rows count both proposals, `records.verify_rows`)."""
    model_drafted: int
    """Tokens a draft model drafted (priced at c each)."""

    @classmethod
    def of(cls, steps: Iterable[Any], row_costs: list[float], mode: str) -> "StepCost":
        tokens, verify, model = 0, 0.0, 0
        for step in steps:
            tokens += step.accepted + 1
            verify += row_costs[min(verify_rows(step), len(row_costs)) - 1]  # k drafted tokens: k + 1 rows
            if step.k and (step.source in MODEL_SOURCES or (step.source is None and mode != "hybrid")):
                model += step.k
            if step.beside is not None and step.beside.source in MODEL_SOURCES:  # a token tree's other proposal
                # both the model's (its chain and its runner-up first token): one chain of draft forwards
                model += max(step.beside.k - step.k, 0) if step.source in MODEL_SOURCES else step.beside.k
        return cls(tokens=tokens, verify_cost=verify, model_drafted=model)


def served_speedup(cost: StepCost, c: float) -> float:
    """Tokens per unit of plain-step cost (plain decoding = 1.0); 1.0 for a request with no steps."""
    total = cost.verify_cost + c * cost.model_drafted
    return cost.tokens / total if total > 0 else 1.0


def modelled_time(row_costs: list[float], warm: Any) -> ModelledTime:
    """The step times a replay's choices read instead of the clock (draftwheel.serving.engine.adaptive.ModelledTime):
    `row_costs` itself (serving's clock learns each row count's own cost too), their least-squares slope
    (cost(rows) = 1 + slope (rows - 1): past the table's end, and for the choices that weigh one more
    row), and the draft's c from `warm`, a completion of that draft alone (mode draft) on the same
    engine kernels (`draft_c`)."""
    extra_rows = range(len(row_costs))  # rows - 1 of each cost
    slope = sum(i * (cost - 1.0) for i, cost in zip(extra_rows, row_costs)) / max(sum(i * i for i in extra_rows), 1)
    cost = StepCost.of(warm.record.steps, row_costs, "draft")
    return ModelledTime(row_slope=max(slope, 0.0), draft_c=draft_c(warm.stats.draft_s, cost.model_drafted,
                                                                    warm.stats.verify_s, cost.verify_cost),
                        row_costs=row_costs)


def draft_c(draft_s: float, model_drafted: int, verify_s: float, verify_cost: float) -> float:
    """c: seconds drafting per model-drafted token over the seconds of one plain step, where the plain
    step's seconds are read off the same requests' verify forwards (their seconds per unit of
    `verify_cost`). Drafting and verifying alternate step by step, so a change in machine load between
    two measurements cannot skew c: a 1-row forward timed apart, before the replays, would be. 0.0 when
    nothing was drafted or timed."""
    return draft_cost_ratio(draft_s, model_drafted, verify_s, verify_cost)
