"""A request's speculative figures on the OpenAI wire, in vLLM's shape: `metrics.speculative_decoding`.

vLLM (started with `--per-request-spec-decode-metrics summary|detailed`) returns, per single-sequence
request, a top-level `metrics` object whose `speculative_decoding` member holds:

- `num_spec_steps`: verification steps that verified drafted tokens (steps with nothing drafted are left out);
- `num_draft_tokens`: tokens drafted over those steps; `num_accepted_draft_tokens`: of them accepted (bonus
  tokens excluded);
- `mean_acceptance_length`: `1 + num_accepted_draft_tokens / num_spec_steps`, bonus token included;
- `draft_acceptance_rate`: `num_accepted_draft_tokens / num_draft_tokens`;
- `num_spec_tokens`: the configured most tokens drafted per step (`k`);
- `acceptance_histogram`: a dense list of `num_spec_tokens + 1` counts, index `j` = steps that accepted
  exactly `j` drafted tokens; `acceptance_histogram_by_draft_length`: per drafted length `k` seen (a string
  key), the same dense list of `k + 1` counts;
- with `detailed`, also `per_step_accepted` and `per_step_drafted` (one entry per step, in order).

`from_record` builds that object from this engine's `AcceptanceRecord`, which draftwheel serve returns so
one client code path reads both servers; `reported_counts` reads one back (from vLLM, draftwheel serve or
a log), checking that its counts agree. Two choices where vLLM's description is silent: with no
verification step the two figures are 0.0 (`draftwheel.serving.engine.acceptance`'s convention, the
counts beside them say nothing was drafted), and a step that drafted more than the request's `k` (the
suffix index's longer proposals) widens `num_spec_tokens` to it, so the histogram keeps its documented
length. Pure functions: no I/O, no HTTP.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from draftwheel.serving.engine.acceptance import acceptance_rate, mean_accepted_length

LEVELS = ("none", "summary", "detailed")
"""`ServeConfig.per_request_spec_decode_metrics`: vLLM's levels of the same name."""


def from_record(record: Any, num_spec_tokens: int, detailed: bool = False) -> dict[str, Any]:
    """The `speculative_decoding` object of one request from its record (steps with `k == 0`, plain
    target steps, are not speculative steps); `num_spec_tokens`: the request's `k`."""
    steps = [(step.k, step.accepted) for step in record.steps if step.k > 0]
    width = max([num_spec_tokens, *(k for k, _ in steps)])
    histogram = [0] * (width + 1)
    by_length: dict[int, list[int]] = {}
    for k, accepted in steps:
        histogram[accepted] += 1
        by_length.setdefault(k, [0] * (k + 1))[accepted] += 1
    drafted, accepted, n = sum(k for k, _ in steps), sum(a for _, a in steps), len(steps)
    block = {
        "mean_acceptance_length": mean_accepted_length(accepted, n),
        "draft_acceptance_rate": acceptance_rate(accepted, drafted),
        "acceptance_histogram": histogram,
        "acceptance_histogram_by_draft_length": {str(k): by_length[k] for k in sorted(by_length)},
        "num_spec_steps": n,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": width,
    }
    if detailed:
        block["per_step_accepted"] = [a for _, a in steps]
        block["per_step_drafted"] = [k for k, _ in steps]
    return block


@dataclass(frozen=True)
class SpecCounts:
    """What a `speculative_decoding` object reports, as the counts an acceptance record keeps."""

    drafted: int
    accepted: int
    steps: int


def _count(block: dict[str, Any], name: str) -> int:
    value = block.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"metrics.speculative_decoding.{name}: expected a count (an integer >= 0), got {value!r}")
    return value


def reported_counts(block: Any) -> SpecCounts:
    """The counts of a `speculative_decoding` object; `ValueError` naming the field when a count is missing
    or negative, accepted exceeds drafted, or a histogram given disagrees with the counts."""
    if not isinstance(block, dict):
        raise ValueError(f"metrics.speculative_decoding: expected an object, got {type(block).__name__}")
    counts = SpecCounts(_count(block, "num_draft_tokens"), _count(block, "num_accepted_draft_tokens"),
                        _count(block, "num_spec_steps"))
    if counts.accepted > counts.drafted:
        raise ValueError(f"metrics.speculative_decoding: num_accepted_draft_tokens={counts.accepted} > "
                         f"num_draft_tokens={counts.drafted}")
    if counts.drafted and not counts.steps:
        raise ValueError(f"metrics.speculative_decoding: num_draft_tokens={counts.drafted} in num_spec_steps=0")
    histogram = block.get("acceptance_histogram")
    if histogram is not None:
        if isinstance(histogram, dict):  # an earlier vLLM shape: a sparse {"j": steps} map
            try:
                histogram = {int(j): n for j, n in histogram.items()}
            except ValueError as exc:
                raise ValueError(f"metrics.speculative_decoding.acceptance_histogram: {exc}") from exc
            histogram = [histogram.get(j, 0) for j in range(max(histogram, default=-1) + 1)]
        if not isinstance(histogram, list) or any(isinstance(n, bool) or not isinstance(n, int) or n < 0
                                                  for n in histogram):
            raise ValueError("metrics.speculative_decoding.acceptance_histogram: expected a list of counts")
        if sum(histogram) != counts.steps or sum(j * n for j, n in enumerate(histogram)) != counts.accepted:
            raise ValueError(f"metrics.speculative_decoding.acceptance_histogram: {histogram} does not give "
                             f"num_spec_steps={counts.steps} and num_accepted_draft_tokens={counts.accepted}")
    return counts
