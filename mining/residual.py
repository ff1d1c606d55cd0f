"""What the served stack missed: a per-token residual of a logged request.

As `draftwheel serve` runs it, a request's output tokens come from three places: drafted tokens the
target accepted (from the suffix index's proposals -- copied spans -- or from the draft model's chain),
and the target's own token at the end of each verification step (the correction at the first rejection,
the bonus token after a fully accepted chain, the token of a plain step, and the first token, from the
prompt's forward, whether a loop records that as a step or not). Speculation paid nowhere on the latter:
serving would only get faster there if the draft learned them. So each output token gets a residual of

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

from draftwheel.serving.engine.records import EAGLE3, LM_DRAFT


def steps_hold_first_token(record: Any) -> bool:
    """Whether a record's steps account for its first output token. The eagle3 and Medusa loops take it
    from the prompt's own forward, before any step. The `lm` draft's loop (mode draft) verifies its first
    drafts in the prompt's forward, and the suffix index's loop (mode suffix, and mode hybrid with an `lm`
    draft) records the prompt's forward as its first step (draftwheel.serving.engine.suffix_decoding). The
    steps' sources tell the loops apart (an eagle3 chain's steps say `eagle3`, an `lm` draft's in the
    hybrid `draft`, in mode draft nothing); a hybrid request the draft never drafted in carries neither,
    and there the token count decides (exact unless EOS or a stop string cut a step's tokens)."""
    sources = {step.source for step in record.steps}
    if EAGLE3 in sources or not record.steps:  # no steps: a loop whose only token came from the prompt's forward
        return False
    if record.mode in ("suffix", "draft") or LM_DRAFT in sources:
        return True
    if record.mode == "hybrid":
        return sum(step.accepted + 1 for step in record.steps) == len(record.output_token_ids)
    return False  # medusa


def served_residual(record: Any) -> list[float]:
    """One residual per output token (see the module docstring), aligned by `steps_hold_first_token`.
    Steps that emitted more tokens than the output kept (EOS or a stop string cut them) are cut to the
    output's length; an output the steps do not account for (a record without steps) is all residual."""
    residual = [] if steps_hold_first_token(record) else [1.0]  # [1.0]: the first token, from the prompt's forward
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
