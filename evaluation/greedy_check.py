"""Is an output the target's own greedy decode? One teacher-forced pass instead of decoding it again.

Greedy decoding picks, at every position, the argmax of the target's logits given the prompt and the
tokens before it. So an output is the target's greedy output exactly when (a) every token is that
argmax and (b) it stops where greedy decoding stops: at its first EOS, or at max_new_tokens. Checking
(a) needs the target's logits at every output position, which one forward over the output gives, fed
on the KV cache in verify-sized chunks: row-invariant attention (draftwheel.serving.engine.row_invariant) makes each row
of such a forward bitwise the row a one-token decoding step computes, the same guarantee greedy
speculative decoding rests on. The prompt is prefilled alone, as plain decoding does.

The shadow gate uses it for its losslessness check: a 48-token output is checked in 4 forwards (the
prompt's, then 47 tokens in chunks of 16) instead of 48 decoding steps. Stop strings are not modelled
(the gate's replays use none).
"""

from __future__ import annotations

from typing import Any

import torch

from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.sampling import greedy

CHUNK = 16  # rows per forward: within the verify sizes the engine runs (k + 1 <= 33 rows)


def teacher_forced_logits(model: Any, prompt_ids: list[int], token_ids: list[int], chunk: int = CHUNK) -> list:
    """The target's logits[V] at every output position of `token_ids` after `prompt_ids`, each bitwise the
    row plain decoding computes there (the module docstring)."""
    lm = CachedLM(model)
    logits = [lm.forward(torch.tensor(prompt_ids), keep=1)[-1]]  # [V]: the first output position
    fed = token_ids[:-1]  # the last token's successor is never needed
    for start in range(0, len(fed), chunk):
        logits.extend(lm.forward(torch.tensor(fed[start:start + chunk])))  # [T, V] rows
    return logits


def logit_margin(model: Any, prompt_ids: list[int], token_ids: list[int], position: int, other: int) -> float:
    """At output `position` of plain decoding's `token_ids`, how far its token's logit is above `other`'s:
    where another decode of the same prompt first chose `other`, a margin near the logits' rounding step
    says the two differ only by float summation order."""
    row = teacher_forced_logits(model, prompt_ids, token_ids[:position + 1])[position].float()
    return float(row[token_ids[position]] - row[other])


def greedy_divergence(model: Any, eos_ids: set[int], prompt_ids: list[int], token_ids: list[int],
                      max_new_tokens: int, chunk: int = CHUNK) -> int | None:
    """The first output position where `token_ids` leaves the target's greedy decode of `prompt_ids`
    (a token that is not the argmax, a token after an EOS, or an early end without one); None when it
    is exactly that decode. `model` is the target as the engine runs it (dtype, attention)."""
    if not token_ids:
        return None if max_new_tokens <= 0 else 0
    logits = teacher_forced_logits(model, prompt_ids, token_ids, chunk)
    for position, (row, token) in enumerate(zip(logits, token_ids)):
        if int(greedy(row)) != token:
            return position
        if token in eos_ids and position < len(token_ids) - 1:
            return position + 1  # greedy decoding stops at its first EOS
    if len(token_ids) > max_new_tokens:
        return max_new_tokens
    if len(token_ids) < max_new_tokens and token_ids[-1] not in eos_ids:
        return len(token_ids)  # ended early without a stop
    return None
