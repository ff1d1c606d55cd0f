"""The acceptance figures of speculative decoding, defined once for serving, mining, training and flows.

`acceptance_rate(accepted, drafted)`: drafted tokens the target accepted, `accepted / drafted`.
`mean_accepted_length(accepted, steps)`: tokens emitted per target verification step, bonus token
included (vLLM's definition), `(accepted + steps) / steps`.
`draft_cost_ratio(draft_s, drafted, verify_s, steps)`: the measured c, seconds per drafted token over
seconds per verification forward.
`common_prefix(a, b)`: where two token sequences first differ; against a greedy output, how many tokens
of a proposal greedy verification accepts.

Convention (docs/log-schema.md, *Derived figures*): when nothing was drafted (or no step verified)
the figure is `0.0`, never `None` or NaN, so every figure is a finite float that JSON, Prometheus,
numpy means and threshold comparisons take as is; whether anything was drafted is told by the counts
reported next to it (`drafted_tokens`, `verify_steps`, `requests_with_drafts`). Callers pass counts,
summed over whatever they aggregate (one request, a slice, a run): the figures are token-weighted.
This module does arithmetic only: no records, no I/O.
"""

from __future__ import annotations


def acceptance_rate(accepted: int | float, drafted: int | float) -> float:
    """accepted / drafted tokens; 0.0 when nothing was drafted."""
    return accepted / drafted if drafted else 0.0


def mean_accepted_length(accepted: int | float, steps: int | float) -> float:
    """Tokens emitted per verification step, bonus included: (accepted + steps) / steps; 0.0 without steps."""
    return (accepted + steps) / steps if steps else 0.0


def draft_cost_ratio(draft_s: float, drafted: int | float, verify_s: float, steps: int | float) -> float:
    """c = (draft_s / drafted) / (verify_s / steps); 0.0 when nothing was drafted or timed."""
    return (draft_s / drafted) / (verify_s / steps) if drafted and verify_s and steps else 0.0


def common_prefix(a: list[int], b: list[int]) -> int:
    """The first position where two token sequences differ (the shorter one's length when one is a prefix
    of the other). Against a greedy output it is how many tokens of a proposal greedy verification
    accepts there."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
