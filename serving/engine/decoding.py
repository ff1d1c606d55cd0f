"""The per-request decoding loops: plain autoregressive and draft-model speculative decoding.

Each loop is a generator that advances one request, pushes the emitted tokens into the request's
`OutputState` and yields after every step (the engine streams text between steps). Shape comments
follow gpt-fast. No I/O, no records: the engine turns `Request.steps` and the timings into the log.

Cache discipline of the speculative loop (why nothing is ever re-encoded): each cache holds the
prompt and emitted tokens except its `*_new` tokens, fed at the next step. For the target that is the
last emitted token; for the draft it is 1 token after a rejection (the correction) or 2 after a full
acceptance (the last draft token, never fed to the draft, and the bonus token). At the start both
are the whole prompt. On rejection both caches are cropped back to the accepted prefix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from draftwheel.serving.engine.adaptive import ALL, PLAIN, AdaptiveK
from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.records import Step
from draftwheel.serving.engine.sampling import greedy, sample, warp
from draftwheel.serving.engine.stopping import OutputState
from draftwheel.serving.engine.verify import verify_greedy, verify_sampled


@dataclass
class Request:
    """The mutable state of one request while it decodes."""
    prompt_ids: torch.Tensor  # [P] long
    params: SamplingParams
    out: OutputState
    generator: torch.Generator
    steps: list[Step] = field(default_factory=list)
    first_token_s: float | None = None  # perf_counter time of the first emitted token
    draft_s: float = 0.0  # seconds spent drafting, summed over steps (the measured draft cost)
    verify_s: float = 0.0  # seconds spent in the target's verification forwards
    regime: str = ALL  # how far it may speculate (the batch engine's, adaptive.SpecGovernor: all, index, plain)
    batch_rows: int = 1  # rows of the last forward it took part in (the batch engine's; 1: alone)
    modelled_time: Any = None  # an adaptive.ModelledTime: the hybrid's choices read it instead of the clock

    @property
    def draft_room(self) -> int:
        """Tokens a draft model may draft in a step: drafts past max_new_tokens would be thrown away; none
        unless the regime is `all` (`index` and `plain` cap the draft model)."""
        return self.out.remaining - 1 if self.regime == ALL else 0

    @property
    def index_room(self) -> int:
        """Tokens the suffix index may propose in a step: drafts past max_new_tokens would be thrown away;
        none under `plain`. The `index` regime leaves it: an index proposal costs verify rows but no
        drafting."""
        return self.out.remaining - 1 if self.regime != PLAIN else 0

    def timed_step(self, draft_s: float, verify_s: float) -> None:
        self.draft_s += draft_s
        self.verify_s += verify_s

    def decision_times(self, draft_s: float, verify_s: float, rows: int, model_drafted: int) -> tuple[float, float]:
        """The (drafting, verify) times a step's choices learn from: as measured, or as `modelled_time`
        prices a verify over `rows` rows and `model_drafted` drafted tokens."""
        if self.modelled_time is None:
            return draft_s, verify_s
        return self.modelled_time.times(rows, model_drafted)

    def emit(self, tokens: list[int]) -> None:
        if self.first_token_s is None:
            self.first_token_s = time.perf_counter()
        self.out.extend(tokens)


def choose(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator) -> int:
    """logits[V] -> one token: argmax when greedy, else a sample from the warped distribution."""
    if params.greedy:
        return int(greedy(logits))
    return int(sample(warp(logits, params), generator))


def autoregressive(target: CachedLM, req: Request) -> Iterator[None]:
    logits = (yield from target.step(req.prompt_ids, keep=1))[-1]  # [V]
    while True:
        token = choose(logits, req.params, req.generator)
        req.emit([token])
        yield
        if req.out.finished:
            return
        logits = (yield from target.step(torch.tensor([token]), keep=1))[-1]  # [V]


def _draft_tokens(draft: CachedLM, pending: torch.Tensor, k: int, req: Request):
    """Run the draft up to k times from `pending`[n]; return tokens[k'] and, when sampling, probs[k', V].
    The chain stops at a drafted EOS (k' <= k): whether the target accepts it (the request ends) or not,
    every token drafted after it would be thrown away.

    The draft cache ends holding pending + the first k'-1 drafted tokens (the last is never fed).
    """
    tokens, probs = [], []
    step_input = pending
    for _ in range(k):
        logits = draft.forward(step_input, keep=1)[-1]  # [V]
        if req.params.greedy:
            token = greedy(logits).view(1)  # [1]
        else:
            q = warp(logits, req.params)  # [V]
            token = sample(q, req.generator).view(1)  # [1]
            probs.append(q)
        tokens.append(token)
        if int(token) in req.out.eos_ids:
            break
        step_input = token
    return torch.cat(tokens), (torch.stack(probs) if probs else None)


def speculative(target: CachedLM, draft: CachedLM, req: Request, controller: AdaptiveK | None) -> Iterator[None]:
    """Draft-model speculative decoding. The first step is the prompt alone, as in plain decoding (a step
    of k = 0): a prefill that also verifies drafts computes their rows with the prefill's kernels, which in
    bfloat16 round unlike the decoding steps they stand for, so greedy output drifted from plain
    decoding's. Every later verify runs on a cache, where its rows are the decoding steps bitwise
    (draftwheel.serving.engine.row_invariant). The draft takes in the prompt alone in that step too, so a
    draft computing the target's function drafts what the target then computes, bitwise."""
    params = req.params
    target_new = draft_new = req.prompt_ids  # tokens not yet in each cache
    while not req.out.finished:
        k = controller.next_k() if controller else params.k
        k = min(k, req.draft_room) if target.length else 0
        if k <= 0:
            token = choose((yield from target.step(target_new, keep=1))[-1], params, req.generator)
            req.steps.append(Step(k=0, accepted=0, draft_token_ids=[], target_token_id=token))
            req.emit([token])
            if not draft.length:  # the prompt's step: the draft takes it in alone too, as the target did
                draft.forward(draft_new, keep=1)
                draft_new = torch.empty(0, dtype=torch.long)
            # the draft has seen neither its pending tokens nor this one (k = 0 mid-request: req.regime)
            target_new, draft_new = torch.tensor([token]), torch.cat([draft_new, torch.tensor([token])])
            yield
            continue
        start = time.perf_counter()
        drafted, q = _draft_tokens(draft, draft_new, k, req)  # [k], [k, V] | None
        draft_s, k = time.perf_counter() - start, len(drafted)  # a drafted EOS ends the chain early
        logits = yield from target.step(torch.cat([target_new, drafted]), keep=k + 1)  # [k+1, V]
        if params.greedy:
            emitted, accepted = verify_greedy(drafted, logits)
        else:
            emitted, accepted = verify_sampled(drafted, q, warp(logits, params), req.generator)
        target.rollback(k - accepted)
        if accepted == k:
            draft_new = emitted[-2:]  # [2]: the last draft token (never fed to the draft) and the bonus
        else:
            draft.rollback(k - 1 - accepted)
            draft_new = emitted[-1:]  # [1]: the target's correction
        target_new = emitted[-1:]  # [1]
        req.timed_step(draft_s, target.last_forward_s)
        if controller:
            controller.update(k, accepted, draft_s, target.last_forward_s)
        emitted_list = emitted.tolist()
        req.steps.append(Step(k=k, accepted=accepted, draft_token_ids=drafted.tolist(),
                              target_token_id=emitted_list[-1]))
        req.emit(emitted_list)
        yield


def medusa(target: CachedLM, heads: torch.nn.Module, req: Request) -> Iterator[None]:
    """Medusa-1 top-1 chain: the heads guess the next tokens from the target's last hidden state; one
    target forward verifies them. The heads' (warped) distributions play the draft's q, so greedy output
    equals the target's and sampling stays lossless."""
    params = req.params
    logits, hidden = yield from target.step(req.prompt_ids, keep=1, hidden=True)  # [1, V], [P, H]
    hidden = hidden[-1]  # [H]: the state whose logits chose `last`
    last = choose(logits[-1], params, req.generator)
    req.emit([last])
    yield
    while not req.out.finished:
        k = min(heads.n_heads, params.k, req.draft_room)
        if k <= 0:
            logits, hiddens = yield from target.step(torch.tensor([last]), keep=1, hidden=True)  # [1, V], [1, H]
            hidden = hiddens[-1]  # the heads' next guesses start from here (k = 0 mid-request: req.regime)
            last = choose(logits[-1], params, req.generator)
            req.steps.append(Step(k=0, accepted=0, draft_token_ids=[], target_token_id=last))
            req.emit([last])
            yield
            continue
        start = time.perf_counter()
        with torch.inference_mode():
            # [k, V]: head i guesses the (i+1)-th token after `last`
            head_logits = heads(hidden.view(1, 1, -1))[:k, 0, 0].cpu()
        if params.greedy:
            drafted, q = greedy(head_logits), None  # [k]
        else:
            q = warp(head_logits, params)  # [k, V]
            drafted = sample(q, req.generator)  # [k]
        draft_s = time.perf_counter() - start
        logits, hiddens = yield from target.step(torch.cat([torch.tensor([last]), drafted]), hidden=True)  # [k+1, V], [k+1, H]
        req.timed_step(draft_s, target.last_forward_s)
        if params.greedy:
            emitted, accepted = verify_greedy(drafted, logits)
        else:
            emitted, accepted = verify_sampled(drafted, q, warp(logits, params), req.generator)
        target.rollback(k - accepted)
        hidden = hiddens[accepted]  # the position whose logits chose the last emitted token
        last = int(emitted[-1])
        req.steps.append(Step(k=k, accepted=accepted, draft_token_ids=drafted.tolist(), target_token_id=last))
        req.emit(emitted.tolist())
        yield
