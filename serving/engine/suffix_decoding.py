"""Decoding loops drafted by the suffix index: mode `suffix` (index only) and mode `hybrid`.

One loop serves both, as a `draftwheel.serving.engine.decoding`-style generator over one request. Each step asks the
suffix index (the shared part over earlier requests and the request's own part over its prompt and
output so far, `draftwheel.serving.engine.suffix`) for a proposal. `suffix` verifies the proposal when there is one and
otherwise takes a plain target step (k=0). `hybrid` verifies it when its score (the estimated accepted
length) beats the draft model's expected accepted length at its k, E(a, k) - 1 with the request's
running acceptance estimate a (`draftwheel.serving.engine.adaptive`), or when drafting does not pay in this request by
its own clock (`draftwheel.serving.engine.adaptive.StepPace`: then a step with no proposal is a plain step), and
otherwise drafts with the model (`_draft_tokens`); a proposal continuing a one-token match only ever
replaces a plain step (`draftwheel.serving.engine.adaptive.suffix_drafts`). Each `Step` says which source drafted it.

Lossless: a proposal is a function of the context alone, so as a draft it is a point mass, q = one-hot
(q(x) = 1): `verify_sampled` accepts x with probability p(x) and otherwise draws from norm(max(0, p - q)),
p without x, which is the target's law; greedy steps use `verify_greedy`.

Cache discipline (no token is ever re-encoded): the target's and the draft's caches hold a prefix of
`context` (prompt + emitted tokens), and each step feeds a cache exactly `context[cache.length:]`.
After the target verifies, it is cropped to the accepted prefix (it then lacks only the last emitted
token). After a model-drafted step the draft cache holds the old context plus the drafts it fed
(all but the last), cropped to the ones accepted; a step the suffix index drafted leaves the draft
cache alone, so the draft's next forward feeds it every token it missed.

Not here: the index (draftwheel.serving.engine.suffix), records and index updates (the engine).
"""

from __future__ import annotations

import time
from typing import Iterator

import torch

from draftwheel.serving.engine.adaptive import (AdaptiveK, LoadPaces, ScoreCalibration, VerifyClock, index_stretch,
                                                learn_index_step, stretch_calibration, suffix_drafts)
from draftwheel.serving.engine.decoding import Request, _draft_tokens
from draftwheel.serving.engine.eagle_decoding import EagleDrafter, eagle3
from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.models import LoadedModel
from draftwheel.serving.engine.records import LM_DRAFT, SUFFIX, Step
from draftwheel.serving.engine.sampling import warp
from draftwheel.serving.engine.suffix import Proposal, RequestIndex, SuffixConfig, SuffixIndex, best_proposal
from draftwheel.serving.engine.verify import point_mass_q, verify_greedy, verify_sampled


def suffix_loop(target: CachedLM, draft: LoadedModel | None, index: SuffixIndex | None,
                req: Request, min_path_prob: float = 0.0, paces: LoadPaces | None = None,
                drafter: EagleDrafter | None = None, index_branch: bool = False,
                runner_up: bool = True) -> Iterator[None]:
    """The loop for mode `suffix` (draft None) or `hybrid` (an `lm` or `eagle3` draft); without a
    shared index only the request's own part proposes. An eagle3 hybrid runs in the eagle3 loop, which
    asks the index first each step (draftwheel.serving.engine.eagle_decoding). The hybrid times its steps
    into `paces`, the pace of each step's load (the engine's `PaceMemory` carries them across requests;
    fresh when None). An eagle3 draft's forwards run through `drafter` when given (the batch engine's),
    else in the loop."""
    if draft is not None and draft.kind == "eagle3":
        local = RequestIndex(req.prompt_ids.tolist(), index.config if index is not None else SuffixConfig())
        seen = [req.prompt_ids.shape[0]]  # how much of the context `local` holds

        def propose(context: list[int], max_k: int) -> Proposal:
            local.extend(context[seen[0]:])
            seen[0] = len(context)
            return best_proposal(context, max_k, local, index)

        controller = AdaptiveK(req.params.k) if req.params.adaptive_k else None
        return eagle3(target, drafter or draft.model, req, controller, min_path_prob, propose, paces, index_branch,
                      runner_up)
    return _decode(target, CachedLM(draft.model) if draft is not None else None, index, req, paces)


def _pending(cache: CachedLM, context: list[int]) -> torch.Tensor:
    """context[cache.length:]: the tokens a cache has not seen yet."""
    return torch.tensor(context[cache.length:], dtype=torch.long)


def _decode(target: CachedLM, draft: CachedLM | None, index: SuffixIndex | None, req: Request,
            paces: LoadPaces | None) -> Iterator[None]:
    params = req.params
    context = req.prompt_ids.tolist()  # prompt + emitted tokens
    local = RequestIndex(context, index.config if index is not None else SuffixConfig())
    model_a = AdaptiveK(params.k)  # the draft model's acceptance estimate (and its k when adaptive)
    calibration = ScoreCalibration()  # how far the index's scores come true in this request
    stretch = stretch_calibration()  # ...and the tokens it offers past its cap (Proposal.stretch)
    if draft is not None and paces is None:
        paces = LoadPaces()  # whether drafting with the model pays, per load (hybrid only)
    index_clock = VerifyClock()  # mode suffix: verify cost by rows, what a stretch token must pay for
    while not req.out.finished:
        pace = paces.at(req.batch_rows) if paces else None
        clock = pace.clock if pace else index_clock
        # Drafts past max_new_tokens would be thrown away. The first forward is the prompt alone, as in
        # plain decoding: a prefill that also verifies drafts runs other kernel shapes, and in bfloat16
        # its rows then differ from plain decoding's (4 of 8 reference prompts diverged).
        prefilled = bool(target.length)
        proposal = best_proposal(context, req.index_room if prefilled else 0, local, index)
        k_model = min(model_a.next_k() if params.adaptive_k else params.k, req.draft_room if prefilled else 0)
        draft_pays = draft is not None and k_model > 0 and pace.draft_pays()
        # a draft that clearly loses explores only where the index offers no better than a plain step
        use_model = draft_pays and not (proposal.tokens and suffix_drafts(
            calibration.scaled(proposal.score), proposal.match_len, not pace.clearly_loses, model_a.a, k_model,
            len(proposal.tokens), model_a.c, pace.clock.cost))
        pending = _pending(target, context)
        before = len(context)
        draft_s, stretched = 0.0, 0
        if use_model:
            prefills_draft = draft.length == 0  # this forward takes in the whole prompt: not a step's usual cost
            start = time.perf_counter()
            drafted, q = _draft_tokens(draft, _pending(draft, context), k_model, req)  # [k], [k, V] | None
            draft_s, source = time.perf_counter() - start, LM_DRAFT
        else:
            stretched = index_stretch(proposal, calibration, stretch, clock.slope)
            drafted, q = torch.tensor(proposal.stretched(stretched).tokens, dtype=torch.long), None  # [k]
            source = SUFFIX if proposal.tokens else None
        k = len(drafted)
        logits = yield from target.step(torch.cat([pending, drafted]), keep=k + 1)  # [k+1, V]
        if params.greedy:
            emitted, accepted = verify_greedy(drafted, logits)
        else:
            if q is None:  # a point-mass draft
                q = point_mass_q(drafted, logits.shape[-1])  # [k, V]
            emitted, accepted = verify_sampled(drafted, q, warp(logits, params), req.generator)
        target.rollback(k - accepted)
        # what this step's choices learn from: its measured times, or the request's modelled ones, at the
        # load the verify ran under
        decide_draft_s, decide_verify_s = req.decision_times(draft_s, target.last_forward_s, k + 1,
                                                             k if use_model else 0)
        pace = paces.at(req.batch_rows) if paces else None
        clock = pace.clock if pace else index_clock
        if pending.shape[0] == 1:  # a verify over k + 1 rows (not the prefill)
            clock.observe(k + 1, decide_verify_s)
        if use_model:
            draft.rollback(draft.length - (before + min(accepted, k - 1)))
            # a step whose draft took in the whole prompt says nothing about the draft's per-token cost c
            model_a.update(k, accepted, decide_draft_s, 0.0 if prefills_draft else decide_verify_s)
            # the draft's prompt intake counts here: drafting at all in a request pays for it
            pace.drafted(accepted + 1, k + 1, decide_draft_s, decide_verify_s)
        elif proposal.tokens:
            learn_index_step(proposal, stretched, accepted, calibration, stretch)
        emitted_list = emitted.tolist()
        context.extend(emitted_list)
        local.extend(emitted_list)
        req.steps.append(Step(k=k, accepted=accepted, draft_token_ids=drafted.tolist(),
                              target_token_id=emitted_list[-1], source=source))
        req.emit(emitted_list)
        yield
