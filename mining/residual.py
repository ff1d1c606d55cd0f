"""What the served stack missed: a per-token residual of a logged request.

As `draftwheel serve` runs it, a request's output tokens come from three places: drafted tokens the
target accepted (from the suffix index's proposals -- copied spans -- or from the draft model's chain),
and the target's own token at the end of each verification step (the correction at the first rejection,
the bonus token after a fully accepted chain, the token of a plain step, and the first token, from the
prefill). Speculation paid nowhere on the latter: serving would only get faster there if the draft
learned them. So each output token gets a residual of

    0.0  drafted by the index or the draft model and accepted (the served stack already has it),
    1.0  emitted by the target itself (nobody drafted it, or what was drafted there was rejected).

Training weighs a position by max(residual, floor) (draftwheel.training.eagle_train, `residual_floor`): a copied
span weighs ~nothing, a span where the draft and the index both failed weighs fully, and the floor keeps
what the draft already does right from being forgotten. `served_share` is the share of a request's
output the stack drafted (1 - mean residual): mining's hard requests are the lowest (`hard_by: served`).
Pure functions of a record; no I/O.
"""

from __future__ import annotations

from typing import Any


def served_residual(record: Any) -> list[float]:
    """One residual per output token (see the module docstring). Steps that emitted more tokens than the
    output kept (a stop string cut the text) are cut to the output's length; an output the steps do not
    account for (a record without steps) is all residual."""
    residual = [1.0]  # the first token comes from the prefill
    for step in record.steps:
        residual += [0.0] * step.accepted + [1.0]
    n = len(record.output_token_ids)
    return (residual + [1.0] * n)[:n]


def served_share(record: Any) -> float:
    """Share of the output tokens the served stack drafted and the target accepted (0.0 for no output).
    A record from another engine has no steps, only its totals: each accepted drafted token is one output
    token, of at least `accepted + verify_steps + 1` (the engine's plain steps are not reported)."""
    if not record.steps and record.accepted_tokens:
        return record.accepted_tokens / max(len(record.output_token_ids),
                                            record.accepted_tokens + record.verify_steps + 1)
    residual = served_residual(record)
    return 1.0 - sum(residual) / len(residual) if residual else 0.0
