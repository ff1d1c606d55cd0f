"""The EAGLE-3 decoding loop: the draft reads the target's own hidden states.

Per step: (1) the draft appends one slot per token the target just confirmed, each pairing the target's
features at position p (from the verification forward that already ran: no extra target pass) with the
token at p+1; (2) it runs ahead k tokens, feeding its own output hidden state where target features do
not exist yet; (3) the target verifies [last token, k drafts] in one forward that also returns the
features of those positions; (4) the draft's speculative slots are cropped and step (1) repeats with
the accepted positions' target features. Nothing is re-encoded: each confirmed position enters each
cache once. A greedy step also verifies the draft's runner-up for the chain's first token beside the
chain, as a one-token branch of a token tree (draftwheel.serving.engine.tree), where its probability,
calibrated by how often it has come true in this slice, pays for the verify row it adds; it needs no
draft forward of its own.

The draft proposes over its own vocabulary; its q is zero outside it, so rejection sampling against
the target's p (draftwheel.serving.engine.verify) stays exact. Greedy output equals the target's.

Hybrid (mode `hybrid` with an eagle3 draft): each step first asks `propose` (the suffix index,
draftwheel.serving.engine.suffix_decoding) for a proposal and verifies it instead of drafting when its score beats the
draft's expected accepted length, or whenever drafting does not pay in this slice at this load
(`draftwheel.serving.engine.adaptive.StepPace`: its tokens per unit of verify cost, weighed with their uncertainty); with
no proposal worth its verify rows then, the step is a plain target step. Such steps leave
the draft cache alone; the positions they confirm join the pending slots, so the draft's next step
consumes their target features together. A greedy step that drafts also verifies the index's proposal
(as much of it as pays for its rows, `adaptive.branch_length`) beside the chain, as one token tree
(draftwheel.serving.engine.tree): whichever of the two the target agrees with further is accepted.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import torch

from draftwheel.serving.engine.acceptance import common_prefix
from draftwheel.serving.engine.adaptive import (PRIOR_ROW_SLOPE, AdaptiveK, LoadPaces, ScoreCalibration,
                                                branch_length, index_stretch, learn_index_step, runner_up_pays,
                                                stretch_calibration, suffix_drafts, tree_beats_index)
from draftwheel.serving.engine.decoding import Request, choose
from draftwheel.serving.engine.eagle import DraftCall, DraftKV, Eagle3Draft
from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.records import EAGLE3, SUFFIX, Beside, Step
from draftwheel.serving.engine.sampling import greedy, sample, warp
from draftwheel.serving.engine.suffix import Proposal
from draftwheel.serving.engine.tree import chain_with_branch, verify_tree_greedy
from draftwheel.serving.engine.verify import point_mass_q, verify_greedy, verify_sampled


class EagleDrafter:
    """The eagle3 draft's forwards as the loops call them, `hidden, logits = yield from drafter.forward(call)`
    (a `DraftCall`: the last slot's hidden state and draft logits): here one request's call runs at once
    and never suspends; the batch engine's drafter suspends until one forward has run for every row's
    call (draftwheel.serving.engine.batching.BatchDrafter). `suspended_s`: seconds spent suspended
    beyond the request's own share of those forwards, so a loop's drafting time is its own."""

    def __init__(self, model: Eagle3Draft):
        self.model = model
        self.suspended_s = 0.0

    def forward(self, call: DraftCall):
        return self.model.extend_many([call])[0]
        yield  # unreachable: makes this a generator the loops can delegate to


def run_serial(steps: Iterator[Any]) -> Any:
    """The value of a generator that never suspends (a loop part over `EagleDrafter`), outside any loop."""
    try:
        next(steps)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a serial drafter suspended")


def _run_ahead(drafter: EagleDrafter, hidden: torch.Tensor, logits: torch.Tensor, k: int, kv: DraftKV,
               req: Request, min_path_prob: float = 0.0):
    """Draft up to k tokens from the last slot's hidden[H] and its draft logits[Vd]; return target
    ids[n] and, when sampling, q[n, V] (`(drafted, q) = yield from _run_ahead(...)`).

    Drafting stops early once the draft's own probability of the whole chain so far falls below
    `min_path_prob` (EAGLE-2's observation: draft confidence predicts acceptance): a further token would
    most likely be rejected, yet costs a draft step and a verify row. Greedy chains read the draft's
    probabilities at its `confidence_temperature`, which training fits so that they match how often the
    target agrees (a round's fine-tuning can leave a draft overconfident, and its chains too long). The
    cut reads only the draft's side, so verification stays exact (any chain length is verified
    losslessly). The chain also stops at a drafted EOS: whether the target accepts it (the request ends)
    or not, what follows it is never emitted."""
    draft = drafter.model
    to_target = draft.draft_to_target  # [Vd]
    tokens, probs = [], []
    path_prob = 1.0
    for i in range(k):
        if req.params.greedy:
            index = greedy(logits)
            if min_path_prob:
                path_prob *= float(confidence_probs(draft, logits)[index])
        else:
            q_draft = warp(logits, req.params)  # [Vd]
            index = sample(q_draft, req.generator)
            path_prob *= float(q_draft[index])
            q = torch.zeros(draft.c.vocab_size)  # [V]: zero outside the draft vocabulary
            q[to_target] = q_draft
            probs.append(q)
        token = to_target[index].view(1)  # [1]
        tokens.append(token)
        # the last token is verified, never fed; after a drafted EOS every token would be thrown away
        if i == k - 1 or path_prob < min_path_prob or int(token) in req.out.eos_ids:
            break
        hidden, logits = yield from drafter.forward(DraftCall(token, hidden.view(1, -1), kv))  # [H], [Vd]
    return torch.cat(tokens), (torch.stack(probs) if probs else None)


def confidence_probs(draft: Eagle3Draft, logits: torch.Tensor) -> torch.Tensor:
    """The draft's probabilities[..., Vd] at its confidence temperature, in float32, from logits[..., Vd]."""
    return torch.softmax(logits.float() / draft.c.confidence_temperature, -1)


def runner_up_of(draft: Eagle3Draft, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The second choice (target ids) and its probability ([...] each) of `confidence_probs`[..., Vd]."""
    top = probs.topk(2, dim=-1)
    return draft.draft_to_target[top.indices[..., 1]], top.values[..., 1]


def draft_runner_up(draft: Eagle3Draft, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft's second choice for its chain's first token (target ids) from that position's draft
    logits[..., Vd], and its probability at the draft's confidence temperature ([...] each). Where the
    chain's first token is rejected, the target's token is often this one (a quarter of such steps on
    held-out chat): verified beside the chain as a one-token branch, it costs one verify row and no draft
    forward. Training's served walk reads the same (draftwheel.training.eagle_ttt.served_walk)."""
    return runner_up_of(draft, confidence_probs(draft, logits))


def _tree_step(chain: Step, chain_accepted: int, branch: list[int], emitted: list[int], source: str) -> Step:
    """A token-tree step's record: the proposal the target accepted further is the step, the other is
    `beside` it. `chain`: the step as the draft's chain (its `accepted` the whole step's); `source`: what
    proposed the branch."""
    index = Beside(k=len(branch), accepted=common_prefix(branch, emitted), draft_token_ids=branch, source=source)
    if index.accepted <= chain_accepted:
        chain.beside = index
        return chain
    own = Beside(k=chain.k, accepted=chain_accepted, draft_token_ids=chain.draft_token_ids, source=chain.source)
    return Step(k=index.k, accepted=chain.accepted, draft_token_ids=branch, target_token_id=chain.target_token_id,
                source=source, beside=own)


def eagle3(target: CachedLM, draft: Eagle3Draft | EagleDrafter, req: Request, controller: AdaptiveK | None,
           min_path_prob: float = 0.0,
           propose: Callable[[list[int], int], Proposal] | None = None,
           paces: LoadPaces | None = None, branches: bool = True,
           runner_up: bool = True) -> Iterator[None]:
    """Decode one request; with `propose` (context, max_k) -> Proposal, as the hybrid (module docstring),
    timing its steps into `paces`, the pace of each step's load (fresh `LoadPaces` when None); with
    `branches`, a greedy draft step verifies the index's proposal beside the chain as one tree, and with
    `runner_up` (where the index's is not) the draft's second choice for its first token. `draft`:
    the model (its forwards run here) or a drafter that runs them (the batch engine's)."""
    drafter = draft if isinstance(draft, EagleDrafter) else EagleDrafter(draft)
    draft = drafter.model
    params = req.params
    aux_ids = draft.c.aux_layer_ids
    kv = DraftKV()
    estimate = controller or AdaptiveK(params.k)  # the draft's acceptance estimate, for the hybrid choice
    calibration = ScoreCalibration()  # how far the index's scores come true in this request
    stretch = stretch_calibration()  # ...and the tokens it offers past its cap (Proposal.stretch)
    if propose and paces is None:
        paces = LoadPaces()  # the hybrid's "is drafting worth a step here?", per load
    # greedy hybrid steps may verify the index's proposal beside the draft's chain (draftwheel.serving.engine.tree)
    trees = bool(propose and branches and params.greedy and getattr(target, "supports_trees", False))
    # greedy steps may verify the draft's second choice for its first token beside the chain
    siblings = bool(runner_up and params.greedy and getattr(target, "supports_trees", False))
    # how far the runner-up's probability comes true: in the hybrid, carried across requests with the paces
    sibling_odds = paces.sibling_odds if paces else ScoreCalibration()
    logits, features = yield from target.step(req.prompt_ids, keep=1, aux=aux_ids)  # [1, V], [P, 3H]
    last = choose(logits[-1], params, req.generator)
    req.emit([last])
    yield
    context = req.prompt_ids.tolist() + [last]  # what the suffix index matches against
    # Slots waiting to enter the draft cache: feature of position p with the token at p+1.
    slot_tokens = torch.cat([req.prompt_ids[1:], torch.tensor([last])])  # [P]
    while not req.out.finished:
        k = controller.next_k() if controller else params.k
        k = min(k, req.draft_room)
        pace = paces.at(req.batch_rows) if paces else None
        if req.out.remaining <= 1:  # the last token: nothing to draft, and no feature needed after it
            last = choose((yield from target.step(torch.tensor([last]), keep=1))[-1], params, req.generator)
            if pace:  # a 1-row forward: what the clock prices every verify against
                pace.clock.observe(1, req.decision_times(0.0, target.last_forward_s, 1, 0)[1])
            req.steps.append(Step(k=0, accepted=0, draft_token_ids=[], target_token_id=last))
            req.emit([last])
            yield
            continue
        # The index may propose past k (up to its max_spec_tokens): long verbatim spans are its strength.
        # k = 0 (the batch engine's cap, req.regime): no chain; the index's proposal (unless capped too) or a
        # plain step, whose features queue for the draft.
        proposal = propose(context, req.index_room) if propose and req.index_room > 0 else None
        use_draft = k > 0 and (pace.draft_pays() if pace else True)
        # a draft that clearly loses explores only where the index offers no better than a plain step
        rivals_index = use_draft and not (pace and pace.clearly_loses)
        from_suffix = bool(proposal and proposal.tokens) and suffix_drafts(
            calibration.scaled(proposal.score), proposal.match_len, rivals_index, estimate.a, k,
            len(proposal.tokens), estimate.c, pace.clock.cost if pace else None)
        if from_suffix and rivals_index and trees and tree_beats_index(
                calibration.scaled(proposal.score), min(1.0, calibration.scaled((proposal.probs or (1.0,))[0])),
                estimate.a, k, len(proposal.tokens), estimate.c, pace.clock.cost):
            from_suffix = False  # an uncertain proposal: draft too, and verify it as the tree's second branch
        by_model = use_draft and not from_suffix  # neither: a plain step (the hybrid's third choice)
        start, suspended = time.perf_counter(), drafter.suspended_s
        branch: list[int] = []  # tokens verified beside the draft's chain, as one tree: the index's, or the
        branch_source = SUFFIX  # draft's runner-up first token (draft_runner_up)
        stretched = 0  # the proposal's stretch tokens verified after its own
        if not by_model:  # the index's proposal, a point mass; or nothing, for a plain step
            if from_suffix:
                stretched = index_stretch(proposal, calibration, stretch, pace.clock.slope)
            tokens = proposal.stretched(stretched).tokens if from_suffix else []
            drafted, q = torch.tensor(tokens, dtype=torch.long), None  # [n]
        else:
            prefills_draft = kv.length == 0  # this extend takes in the whole prompt: not a step's usual cost
            committed = kv.length + slot_tokens.shape[0]
            hidden, logits = yield from drafter.forward(DraftCall(slot_tokens, features, kv, project=True))
            # [n], [n, V] | None (n <= k)
            drafted, q = yield from _run_ahead(drafter, hidden, logits, k, kv, req, min_path_prob)
            if trees and proposal and proposal.tokens:
                # a tree's nodes stay within the request's room, as a chain's do (k <= remaining - 1): the
                # batch engine holds a request's KV blocks for its prompt and max_new_tokens only
                room = req.out.remaining - drafted.shape[0]
                branch = proposal.tokens[:min(room, branch_length(proposal.probs, calibration.ratio, pace.clock.slope,
                                                                  pace.ratio or 1.0, estimate.a))]
            if siblings and not branch:
                sibling, sibling_prob = draft_runner_up(draft, logits)
                sibling_prob = float(sibling_prob)
                if runner_up_pays(sibling_odds, sibling_prob, pace.clock.slope if pace else PRIOR_ROW_SLOPE,
                                  pace.ratio if pace and pace.ratio else 1.0):
                    branch, branch_source = [int(sibling)], EAGLE3
        k = drafted.shape[0]
        draft_s = time.perf_counter() - start - (drafter.suspended_s - suspended)
        tree = chain_with_branch(last, drafted.tolist(), branch) if branch else None
        if tree is not None and len(tree) == k + 1:  # the chain starts with the whole branch: nothing to add
            tree, branch = None, []
        if tree is None:
            rows = k + 1
            logits, new_features = yield from target.step(torch.cat([torch.tensor([last]), drafted]), keep=rows,
                                                           aux=aux_ids)
            if params.greedy:
                emitted, accepted = verify_greedy(drafted, logits)
            else:
                if q is None:
                    q = point_mass_q(drafted, logits.shape[-1])  # [n, V]
                emitted, accepted = verify_sampled(drafted, q, warp(logits, params), req.generator)
            target.rollback(k - accepted)
        else:
            rows = len(tree)
            logits, new_features = yield from target.step(torch.tensor(tree.tokens), keep=rows, aux=aux_ids,
                                                           tree=None if tree.is_chain else tree)
            emitted, path = verify_tree_greedy(tree, logits)
            accepted = len(path) - 1
            target.keep_path(rows, path)
            new_features = new_features[path]
        # what this step's choices learn from: its measured times, or the request's modelled ones, at the
        # load the verify ran under
        decide_draft_s, decide_verify_s = req.decision_times(draft_s, target.last_forward_s, rows, k if by_model else 0)
        pace = paces.at(req.batch_rows) if paces else None
        if pace:
            pace.clock.observe(rows, decide_verify_s)
        # new_features[:a+1]: positions of `last` and the accepted drafts; `emitted` follows them.
        chain_accepted = common_prefix(drafted.tolist(), emitted.tolist()) if branch else accepted
        if not by_model:  # the draft consumed nothing this step: these slots queue behind the pending ones
            if from_suffix:
                learn_index_step(proposal, stretched, accepted, calibration, stretch)
            features = torch.cat([features, new_features[: accepted + 1]])
            slot_tokens = torch.cat([slot_tokens, emitted])
        else:
            kv.crop(committed)  # drop the slots that ran on the draft's own features
            features, slot_tokens = new_features[: accepted + 1], emitted  # [a+1, 3H], [a+1]
            # a step whose draft took in the whole prompt says nothing about the draft's per-token cost c
            estimate.update(k, chain_accepted, decide_draft_s, 0.0 if prefills_draft else decide_verify_s)
            if pace:  # the draft's prompt intake counts here: drafting at all in a request pays for it
                pace.drafted(accepted + 1, rows, decide_draft_s, decide_verify_s)
            if branch and branch_source == SUFFIX:
                calibration.update(sum(proposal.probs[:len(branch)]), common_prefix(branch, emitted.tolist()))
            elif branch:
                sibling_odds.update(sibling_prob, common_prefix(branch, emitted.tolist()))
        last = int(emitted[-1])
        req.timed_step(draft_s, target.last_forward_s)
        source = EAGLE3 if by_model else SUFFIX if from_suffix else None
        step = Step(k=k, accepted=accepted, draft_token_ids=drafted.tolist(), target_token_id=last, source=source)
        req.steps.append(_tree_step(step, chain_accepted, branch, emitted.tolist(), branch_source) if branch else step)
        context.extend(emitted.tolist())
        req.emit(emitted.tolist())
        yield
