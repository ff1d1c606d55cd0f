"""What a draft proposes after a context, outside any request: the chain the engine would verify next.

`propose(context_ids, k, draft=..., target=..., heads=...)` runs the decoding loops' own drafting code
(`draftwheel.serving.engine.decoding`, `draftwheel.serving.engine.eagle_decoding`), greedily, for a context
whose every token is taken as confirmed:

- an `lm` draft continues the context itself (the target is not read);
- an `eagle3` draft reads the target's features of every context token but the last, each paired with the
  token after it, as the loop feeds it after a verification, and runs ahead k tokens;
- Medusa heads read the target's last hidden state before the context's last token (k at most its heads).

So on the context of a greedy request at one of its steps (the prompt and every token emitted before the
step), the result is the `draft_token_ids` the step verified, when it drafted k tokens with no chain cut
(a serving chain also stops at a drafted EOS; here the k tokens go on past one).
No sampling, no verification, no I/O: `draftwheel.serving.draft_pyfunc` serves this as an MLflow model.
"""

from __future__ import annotations

from typing import Any

import torch

from draftwheel.serving.engine.decoding import Request, _draft_tokens
from draftwheel.serving.engine.eagle import DraftCall, DraftKV
from draftwheel.serving.engine.eagle_decoding import EagleDrafter, _run_ahead, run_serial
from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.models import LoadedModel
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.sampling import greedy, make_generator
from draftwheel.serving.engine.stopping import OutputState


def greedy_request(ids: torch.Tensor, k: int, eos_ids: set[int] = frozenset()) -> Request:
    """The request state the drafting functions read, outside any request: greedy (no generator draw),
    room for k drafts, and the EOS ids a chain stops at (none: always k tokens)."""
    params = SamplingParams(max_new_tokens=k + 1, temperature=0.0, k=k)
    return Request(prompt_ids=ids, params=params, out=OutputState(None, set(eos_ids), [], k + 1),
                   generator=make_generator(None))


def _check_fits(n_context: int, k: int, models: list[Any]) -> None:
    for model in models:
        limit = getattr(model.config, "max_position_embeddings", None)
        if limit and n_context + k > limit:
            raise ValueError(f"token_ids: the context ({n_context} tokens) + k ({k}) exceeds the model context "
                             f"of {limit} tokens")


def propose(context_ids: list[int], k: int, draft: LoadedModel | None = None, target: LoadedModel | None = None,
            heads: Any = None) -> list[int]:
    """The k token ids `draft` (or Medusa `heads`, on `target`) proposes right after `context_ids` (module
    docstring). An eagle3 draft and Medusa heads need the `target` they read, attached as the engine
    attaches it (`check_compatible`); raises ValueError naming `k` or `token_ids` for an unusable request."""
    if k < 1:
        raise ValueError(f"k: must be at least 1, got {k}")
    ids = torch.tensor(list(context_ids), dtype=torch.long)  # [P]
    reads_target = heads is not None or (draft is not None and draft.kind == "eagle3")
    if reads_target and target is None:
        raise ValueError("target: an eagle3 draft and Medusa heads read the target's hidden states; none given")
    if ids.numel() < (2 if reads_target else 1):
        raise ValueError(f"token_ids: the context needs at least {2 if reads_target else 1} tokens, "
                         f"got {ids.numel()}")
    _check_fits(ids.numel(), k, [m.model for m in (draft, target) if m is not None])
    if heads is not None:
        k = min(k, heads.n_heads)
        _, hidden = CachedLM(target.model).forward(ids[:-1], keep=1, hidden=True)  # [P-1, H]
        with torch.inference_mode():
            return greedy(heads(hidden[-1].view(1, 1, -1))[:k, 0, 0]).tolist()  # [k]
    if draft is None:
        raise ValueError("draft: neither a draft nor Medusa heads given")
    req = greedy_request(ids, k)  # no EOS: always k tokens, where a serving chain stops at a drafted EOS
    if draft.kind == "eagle3":
        model = draft.model
        _, features = CachedLM(target.model).forward(ids[:-1], keep=1, aux=model.c.aux_layer_ids)  # [P-1, 3H]
        kv, drafter = DraftKV(), EagleDrafter(model)
        (hidden, logits), = model.extend_many([DraftCall(ids[1:], features, kv, project=True)])  # [H], [Vd]
        return run_serial(_run_ahead(drafter, hidden, logits, k, kv, req))[0].tolist()
    return _draft_tokens(CachedLM(draft.model), ids, k, req)[0].tolist()
