"""The serving engine: one target, optionally a draft model (or Medusa heads), requests one at a time.

`Engine.generate` / `Engine.stream` tokenise a prompt (applying the chat template when asked), run one
of the decoding loops in `draftwheel.serving.engine.decoding`, and turn the result into a `Completion` carrying
per-request stats and the v1 `AcceptanceRecord`, which is also handed to the optional sink and
metrics objects (and to the suffix index, which learns from every finished request). An optional
router (`draftwheel.serving.engine.routing`) picks the mode of requests that name none. Batch size is 1; concurrency
(queueing) is the HTTP layer's business, and concurrent calls are safe because every request owns its
KV caches. The engine does not scrub PII, rotate logs or export metrics itself.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from draftwheel.serving.engine.adaptive import AdaptiveK, LoadPaces, PaceMemory
from draftwheel.serving.engine.decoding import Request, autoregressive, medusa, speculative
from draftwheel.serving.engine.eagle_decoding import eagle3
from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.models import LoadedModel, check_compatible
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.prepack import prepack_linears
from draftwheel.serving.engine.row_invariant import use_row_invariant_attention
from draftwheel.serving.engine.records import MODES, AcceptanceRecord, ModelId, Sampling
from draftwheel.serving.engine.sampling import make_generator
from draftwheel.serving.engine.stopping import OutputState
from draftwheel.serving.engine.suffix import SuffixIndex
from draftwheel.serving.engine.suffix_decoding import suffix_loop

log = logging.getLogger(__name__)


class PromptTooLongError(ValueError):
    """The prompt plus max_new_tokens does not fit the model's context."""


@dataclass
class RequestStats:
    prompt_tokens: int
    generated_tokens: int
    drafted_tokens: int
    accepted_tokens: int
    verify_steps: int
    acceptance_rate: float
    mean_accepted_length: float
    ttft_s: float
    latency_s: float
    tokens_per_s: float
    draft_s: float = 0.0   # time spent drafting (draft-model, eagle3 and medusa modes)
    verify_s: float = 0.0  # time spent in verification forwards


@dataclass
class RequestRun:
    """One request between `Engine.start` and `Engine.finish`: what its record is made of."""
    prompt: Any
    req: Request
    mode: str
    draft: LoadedModel | None
    slice: str
    text_in: str
    seed: int | None
    pick: Any  # the router's pick, if it chose the mode
    pace_key: tuple | None
    paces: LoadPaces | None  # the hybrid's step paces, by load
    ts: float  # wall clock at the start
    start: float  # perf_counter at the start: TTFT and latency count from here


@dataclass
class Completion:
    request_id: str
    prompt: Any  # the caller's prompt: a string, or a list of chat messages
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    finish_reason: str
    stats: RequestStats
    record: AcceptanceRecord


def eos_token_ids(loaded: LoadedModel) -> set[int]:
    """EOS ids as HF generate uses them: the generation config's, else the tokenizer's."""
    eos = getattr(loaded.model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = loaded.tokenizer.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())


def encode(tokenizer: Any, prompt: Any, chat: bool) -> tuple[str, list[int]]:
    """prompt -> (text as fed to the model, token ids): how every request's prompt is tokenised. With chat,
    the chat template is applied (a string is one user message)."""
    if chat:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return text, tokenizer(text, add_special_tokens=False)["input_ids"]
    if not isinstance(prompt, str):
        raise ValueError("prompt: expected a string (chat=False)")
    return prompt, tokenizer(prompt)["input_ids"]


class Engine:
    def __init__(self, target: LoadedModel, draft: LoadedModel | None = None, medusa: Any = None,
                 sink: Any = None, metrics: Any = None, medusa_id: ModelId | None = None, prepack: bool = True,
                 suffix_index: SuffixIndex | None = None, router: Any = None, dtype: torch.dtype | None = None,
                 min_path_prob: float = 0.0, index_branch: bool = False, modelled_time: Any = None,
                 runner_up: bool = True):
        """With `prepack` (the default), CPU models get oneDNN-packed linear layers, in place
        (draftwheel.serving.engine.prepack): the engine owns the models it is given. With `dtype` the target is cast to it
        in place (draftwheel.serving.engine.precision); by default it keeps the dtype it was loaded in. Drafts and heads
        always follow the target's dtype. With `router` (a `draftwheel.serving.engine.routing.RequestRouter`), requests
        that name no mode get the mode and k it picks. `min_path_prob` cuts an eagle3 draft chain once the
        draft's own probability of it falls below this (draftwheel.serving.engine.eagle_decoding; 0 = always k tokens).
        With `runner_up`, a greedy eagle3 step also verifies the draft's second choice for its chain's first
        token beside the chain, where its calibrated odds pay for the row (draftwheel.serving.engine.eagle_decoding).
        With `index_branch`, a greedy hybrid step that drafts also verifies the suffix index's proposal beside
        the chain, as one token tree (draftwheel.serving.engine.tree). With `modelled_time` (an
        `adaptive.ModelledTime`), the hybrid's choices read modelled step times instead of the clock: for
        benchmarks that compare settings (serving leaves it None)."""
        if not 0.0 <= min_path_prob < 1.0:
            raise ValueError(f"min_path_prob: must be in [0, 1), got {min_path_prob!r}")
        self.min_path_prob = min_path_prob
        self.index_branch = index_branch
        self.runner_up = runner_up  # greedy eagle3 steps verify the draft's runner-up first token too
        self.modelled_time = modelled_time
        if dtype is not None:
            target.model.to(dtype)
        self.dtype = next(target.model.parameters()).dtype
        self.prepack = prepack
        self._adopt(target)
        if draft is not None:
            self._adopt(draft)
            check_compatible(target, draft)
        if medusa is not None:
            medusa.to(self.dtype)
        self.target = target
        self._draft = draft
        self.medusa = medusa
        self.medusa_id = medusa_id or (ModelId(name="medusa-heads") if medusa is not None else None)
        self.sink = sink
        self.metrics = metrics
        self.eos_ids = eos_token_ids(target)
        self.suffix_index = suffix_index  # modes suffix/hybrid draft from it; every finished request updates it
        if suffix_index is not None:
            suffix_index.check_target(target.model_id)
        self.router = router
        self.paces = PaceMemory()  # mode hybrid: per (slice, draft), whether drafting pays (draftwheel.serving.engine.adaptive)

    def _adopt(self, loaded: LoadedModel) -> None:
        """Cast a model to the engine's dtype (before packing: a packed weight is tied to its dtype), pack it,
        and give a transformers model row-invariant attention: the target's verify rows are then its decoding
        steps bitwise (draftwheel.serving.engine.row_invariant), and a draft LM's short calls take the same
        path as the target's (a draft that computes the target's function drafts exactly its tokens)."""
        loaded.model.to(self.dtype)
        if self.prepack:
            prepack_linears(loaded.model)
        use_row_invariant_attention(loaded.model)

    @property
    def draft(self) -> LoadedModel | None:
        return self._draft

    def swap_draft(self, loaded: LoadedModel) -> None:
        """Serve a new draft from the next request on; running requests keep the draft they started with."""
        self._adopt(loaded)
        check_compatible(self.target, loaded)
        # A single reference assignment is atomic; every request reads self._draft once at its start.
        self._draft = loaded

    @property
    def default_mode(self) -> str:
        if self._draft is not None:  # with the suffix tier, serving's default is the hybrid (serve_config)
            return "hybrid" if self.suffix_index is not None else "draft"
        return "medusa" if self.medusa is not None else "autoregressive"

    def encode(self, prompt: Any, chat: bool) -> tuple[str, list[int]]:
        """prompt -> (text as fed to the model, token ids), with the target's tokenizer (`encode`)."""
        return encode(self.target.tokenizer, prompt, chat)

    def _check_fits(self, n_prompt: int, params: SamplingParams, models: list[Any]) -> None:
        if n_prompt == 0:
            raise ValueError("prompt: empty after tokenisation")
        for model in models:
            limit = getattr(model.config, "max_position_embeddings", None)
            if limit and n_prompt + params.max_new_tokens > limit:
                raise PromptTooLongError(f"prompt ({n_prompt} tokens) + max_new_tokens ({params.max_new_tokens}) "
                                         f"exceeds the model context of {limit} tokens")

    def _resolve_mode(self, mode: str | None, draft: LoadedModel | None) -> str:
        mode = mode or self.default_mode
        if mode not in MODES:
            raise ValueError(f"mode: {mode!r} not one of {', '.join(MODES)}")
        if mode in ("draft", "hybrid") and draft is None:
            raise ValueError(f"mode: {mode!r} needs a draft model")
        if mode == "medusa" and self.medusa is None:
            raise ValueError("mode: 'medusa' needs Medusa heads")
        return mode

    def _loop(self, run: RequestRun, target: Any, drafter: Any = None):
        mode, draft, req, params = run.mode, run.draft, run.req, run.req.params
        if mode in ("suffix", "hybrid"):
            return suffix_loop(target, draft if mode == "hybrid" else None, self.suffix_index, req,
                               self.min_path_prob, run.paces, drafter, self.index_branch, self.runner_up)
        if mode == "draft":
            controller = AdaptiveK(params.k) if params.adaptive_k else None
            if draft.kind == "eagle3":
                return eagle3(target, drafter or draft.model, req, controller, self.min_path_prob,
                              runner_up=self.runner_up)
            return speculative(target, CachedLM(draft.model), req, controller)
        if mode == "medusa":
            return medusa(target, self.medusa, req)
        return autoregressive(target, req)

    def start(self, prompt: Any, params: SamplingParams | None = None, slice: str = "default",
              chat: bool = False, mode: str | None = None) -> RequestRun:
        """Check and set up one request (tokenise, pick mode and draft, seed); its clock starts here.
        Raises on bad input (`PromptTooLongError`, `ValueError` naming the field) before any decoding."""
        params = params or SamplingParams()
        draft = self._draft  # read once: a concurrent swap_draft does not affect this request
        text_in, ids = self.encode(prompt, chat)
        pick = self.router.pick(draft, self.suffix_index, slice, ids) if mode is None and self.router else None
        if pick is not None:
            mode, params = pick.mode, dataclasses.replace(params, k=pick.k or params.k)
        mode = self._resolve_mode(mode, draft)
        self._check_fits(len(ids), params,
                         [self.target.model] + ([draft.model] if mode in ("draft", "hybrid") else []))
        seed = params.seed if params.seed is not None or params.greedy else int(torch.randint(0, 2**62, (1,)))
        req = Request(prompt_ids=torch.tensor(ids), params=params, generator=make_generator(seed),
                      out=OutputState(self.target.tokenizer, self.eos_ids, params.stop, params.max_new_tokens),
                      modelled_time=self.modelled_time)
        # The hybrid's "does drafting pay?" carries over from the slice's last request with this draft.
        pace_key = (slice, draft.model_id.name, draft.model_id.version, draft.model_id.sha256) \
            if mode == "hybrid" else None
        paces = self.paces.resume(pace_key) if pace_key else None
        return RequestRun(prompt=prompt, req=req, mode=mode, draft=draft, slice=slice, text_in=text_in, seed=seed,
                          pick=pick, pace_key=pace_key, paces=paces, ts=time.time(), start=time.perf_counter())

    def decode(self, run: RequestRun, target: Any = None, drafter: Any = None) -> Iterator[Any]:
        """The request's decoding loop (draftwheel.serving.engine.decoding and friends) over `target`, by default
        a `CachedLM` of its own; it yields after every step, and the batch engine's paged rows also yield
        their forward calls (draftwheel.serving.engine.batching), as its eagle3 `drafter` yields the draft's
        (None: the draft's forwards run in the loop, `EagleDrafter`)."""
        return self._loop(run, target if target is not None else CachedLM(self.target.model), drafter)

    def finish(self, run: RequestRun) -> Completion:
        """The finished request's record (published to the sink, metrics and suffix index) and `Completion`."""
        latency = time.perf_counter() - run.start
        if run.pace_key:
            self.paces.keep(run.pace_key, run.paces)
        record = self._record(run.req, run.mode, run.draft, run.slice, run.text_in, run.seed, run.ts, run.start,
                              latency)
        self._publish(record)
        completion = self._completion(run.prompt, run.req, record)
        if run.pick is not None:
            self.router.learn(run.pick, run.draft, completion.stats.tokens_per_s,
                              record.acceptance_rate if record.drafted_tokens else None)
        return completion

    def stream(self, prompt: Any, params: SamplingParams | None = None, slice: str = "default",
               chat: bool = False, mode: str | None = None,
               cancel: threading.Event | None = None) -> Iterator[str | Completion]:
        """Yield text deltas as they become stable, then the final `Completion`. Once `cancel` is set the
        generator ends at the next step, with no `Completion` and no record: it is checked every step, since
        text can stay held back (an incomplete character, a stop-string prefix) for the rest of a request."""
        run = self.start(prompt, params, slice, chat, mode)
        sent = 0
        for _ in self.decode(run):
            if cancel is not None and cancel.is_set():
                return
            stable = run.req.out.stable_text()
            if len(stable) > sent:
                yield stable[sent:]
                sent = len(stable)
        yield self.finish(run)

    def generate(self, prompts: list[Any], params: SamplingParams | None = None, slice: str = "default",
                 chat: bool = False, mode: str | None = None) -> list[Completion]:
        """Run each prompt to completion, in order."""
        completions = []
        for prompt in prompts:
            *_, completion = self.stream(prompt, params, slice=slice, chat=chat, mode=mode)
            completions.append(completion)
        return completions

    def _record(self, req: Request, mode: str, draft: LoadedModel | None, slice: str, text_in: str,
                seed: int | None, ts: float, start: float, latency: float) -> AcceptanceRecord:
        p = req.params
        return AcceptanceRecord(
            request_id=uuid.uuid4().hex, ts=ts, slice=slice, target_id=self.target.model_id,
            draft_id={"draft": draft.model_id if draft else None, "medusa": self.medusa_id,
                      "hybrid": draft.model_id if draft else None}.get(mode), mode=mode,
            sampling=Sampling(temperature=p.temperature, top_p=p.top_p, top_k=p.top_k, seed=seed),
            prompt=text_in, prompt_token_ids=req.prompt_ids.tolist(), output=req.out.text,
            output_token_ids=list(req.out.token_ids), finish_reason=req.out.finish_reason or "length",
            steps=req.steps, drafted_tokens=sum(s.k for s in req.steps),
            accepted_tokens=sum(s.accepted for s in req.steps), verify_steps=len(req.steps),
            ttft_s=(req.first_token_s or start) - start, latency_s=latency,
        )

    def _publish(self, record: AcceptanceRecord) -> None:
        """Hand the record to the sink and metrics; their failures never fail the request."""
        for target in (self.sink and self.sink.write, self.metrics and self.metrics.observe,
                       self.suffix_index and self.suffix_index.add_record):
            if not target:
                continue
            try:
                target(record)
            except Exception:  # noqa: BLE001 - logging must not break serving
                log.exception("publishing acceptance record %s failed", record.request_id)

    @staticmethod
    def _completion(prompt: Any, req: Request, record: AcceptanceRecord) -> Completion:
        generated = len(record.output_token_ids)
        stats = RequestStats(
            prompt_tokens=len(record.prompt_token_ids), generated_tokens=generated,
            drafted_tokens=record.drafted_tokens, accepted_tokens=record.accepted_tokens,
            verify_steps=record.verify_steps, acceptance_rate=record.acceptance_rate,
            mean_accepted_length=record.mean_accepted_length, ttft_s=record.ttft_s,
            latency_s=record.latency_s, tokens_per_s=generated / record.latency_s if record.latency_s else 0.0,
            draft_s=req.draft_s, verify_s=req.verify_s,
        )
        return Completion(request_id=record.request_id, prompt=prompt, prompt_token_ids=record.prompt_token_ids,
                          text=record.output, token_ids=record.output_token_ids,
                          finish_reason=record.finish_reason, stats=stats, record=record)
