"""The batch engine: many requests decoding at once, one target forward per step for all of them.

`BatchEngine(engine, config)` wraps an `Engine` (draftwheel.serving.engine.engine): requests are set up
and recorded by the engine exactly as one at a time (`Engine.start`, `Engine.finish`: the same checks,
acceptance record, sink, metrics and suffix index), and decoded by the engine's own loops, unchanged
(plain, draft, eagle3, medusa, suffix, hybrid) with a `PagedRow` standing in for each request's
`CachedLM`: where a loop calls the target (`yield from target.step(...)`) the row suspends, handing
over its call. One thread runs the steps: the scheduler (draftwheel.serving.engine.scheduler) admits
requests and picks the rows, the paged runner (draftwheel.serving.engine.batch_kv) runs every row's
call in one forward -- a plain step, the k + 1 rows of a verify, a chunk of a prompt -- and each row's
loop resumes with its own logits: drafting, the pure per-request verification
(draftwheel.serving.engine.verify) and its rollback (its length goes down) stay the request's own.

Callers: `stream(...)` (the `Engine.stream` contract: text deltas, then the `Completion`; it ends
early when `cancel` is set, and the request's blocks go back at the next step), `submit(...)` for a
handle, `generate(prompts, ...)` to run a list at once. A full queue raises `QueueFullError`.
An eagle3 draft's forwards are batched the same way (`BatchDrafter`: every row waiting on a draft
forward suspends, and one `Eagle3Draft.extend_many` runs them all, each row's chain one token per
round); `lm` and Medusa drafts run per row, inside their row's turn. Each row's loop sees
as its forward time its share of the batch's forward (draftwheel.serving.engine.adaptive.ForwardClock),
so the hybrid's per-request choice between the index's proposal, the draft and a plain step weighs a
drafted token against the batch's throughput at the current batch size: speculation backs off under load.
Not here: HTTP (draftwheel.serving.server.app), block accounting (blocks), the attention (batch_kv).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from draftwheel.serving.engine.adaptive import ALL, REGIMES, TWO_REGIMES, ForwardClock, SpecGovernor
from draftwheel.serving.engine.batch_kv import KVPool, PagedRunner, RowCall
from draftwheel.serving.engine.blocks import BlockManager
from draftwheel.serving.engine.eagle import DraftCall
from draftwheel.serving.engine.eagle_decoding import EagleDrafter
from draftwheel.serving.engine.engine import Completion, Engine, RequestRun
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.records import LOAD
from draftwheel.serving.engine.scheduler import QueueFullError, Scheduler, SchedulerConfig, Sequence
from draftwheel.serving.engine.tree import Tree

log = logging.getLogger(__name__)

__all__ = ["BatchConfig", "BatchEngine", "PagedRow", "QueueFullError"]


@dataclass
class BatchConfig:
    """Sizes of the batch engine (`draftwheel serve` reads them from ServeConfig)."""
    max_batch: int = 16  # requests decoding at once
    max_batch_tokens: int = 512  # tokens per forward; longer prompts are read in chunks
    kv_blocks: int = 1024  # KV pool size, in blocks
    kv_block_size: int = 16  # token positions per block
    max_waiting: int = 256  # queued requests beyond which new ones are refused
    prefix_caching: bool = False  # requests share the KV blocks of a prompt prefix computed before (blocks.py)
    spec_explore: float = 0.1  # share of spans the governor tries a losing regime while the best is not told apart
    spec_explore_clear: float = 0.02  # ...and once it is (adaptive.SpecGovernor)
    spec_index_regime: bool = False  # the governor also weighs the suffix index alone, the draft model capped


class PagedRow:
    """A request's target inside the batch: the decoding loops' `CachedLM`, whose `step` suspends."""

    supports_trees = True  # `step(..., tree=)`: greedy steps verify the draft's runner-up or the index's proposal beside the chain

    def __init__(self, seq: Sequence, pool: KVPool):
        self.seq, self.pool = seq, pool
        self.last_forward_s = 0.0  # its share of the last forward it took part in (adaptive.ForwardClock)

    @property
    def length(self) -> int:
        """Positions in its cache; 0 before its first forward, so every loop hands over its whole prompt
        (the engine skips a shared prefix of it, `Sequence.cached`)."""
        return 0 if self.seq.prefilling else self.seq.length

    def step(self, input_ids: torch.Tensor, keep: int = 0, hidden: bool = False, aux: list[int] | None = None,
             tree: Tree | None = None):
        """Hand the call to the batch engine; resume with what `CachedLM.forward` would return."""
        result = yield RowCall(input_ids, self.seq.length, self.seq.table, keep, hidden, aux, tree)
        return result

    def rollback(self, n_tokens: int) -> None:
        """Forget the last `n_tokens` positions: the next writes overwrite their slots."""
        if n_tokens > 0:
            self.seq.length -= n_tokens

    def keep_path(self, nodes: int, path: list[int]) -> None:
        """After a tree verify of `nodes` nodes: keep the positions of the nodes on `path` (ascending, the
        root first), in order (`CachedLM.keep_path`)."""
        if path != list(range(len(path))):  # not a prefix of the nodes: move the path's keys down first
            self.pool.keep_path(self.seq.table, self.seq.length - nodes, path)
        self.rollback(nodes - len(path))


class BatchDrafter(EagleDrafter):
    """A request's eagle3 draft inside the batch: each forward it asks for suspends until the engine has
    run one forward for every row waiting on the same draft (`Eagle3Draft.extend_many`), and resumes with
    its result and its share of that forward's time (by slots)."""

    def forward(self, call: DraftCall):
        began = time.perf_counter()
        hidden, logits, share_s = yield call
        self.suspended_s += max(0.0, time.perf_counter() - began - share_s)
        return hidden, logits


class Handle:
    """One submitted request: its items arrive on `items` (text deltas, then a Completion or an error)."""

    def __init__(self, engine: "BatchEngine", run: RequestRun):
        self.run, self.engine = run, engine
        self.items: queue.Queue = queue.Queue()
        # Modes that read the target's states at every prompt position (eagle3, medusa) compute them all.
        needs_states = run.mode == "medusa" or (run.mode in ("draft", "hybrid") and run.draft.kind == "eagle3")
        self.seq = Sequence(max_positions=run.req.prompt_ids.shape[0] + run.req.params.max_new_tokens,
                            payload=self, prompt=None if needs_states else run.req.prompt_ids.tolist())
        self.row = PagedRow(self.seq, engine.pool)
        self.loop: Iterator[Any] | None = None
        self.call: RowCall | None = None  # the forward call being fed
        self.draft_call: DraftCall | None = None  # the draft forward it waits on
        self.capped_at: int | None = None  # steps so far when the loop called with drafting capped to 0
        self.parts: list[Any] = []  # results of its chunks so far
        self.sent = 0  # characters of stable text handed out
        self.cancelled = False
        self.queued_s = 0.0  # seconds between submission and admission

    def cancel(self) -> None:
        """Stop the request at the next step and free its blocks (a no-op once it has finished)."""
        self.cancelled = True
        self.engine._wake()

    def results(self, cancel: threading.Event | None = None, poll_s: float = 0.05) -> Iterator[str | Completion]:
        """Text deltas, then the Completion; ends early, cancelling, once `cancel` is set."""
        try:
            while True:
                try:
                    item = self.items.get(timeout=poll_s)
                except queue.Empty:
                    if cancel is not None and cancel.is_set():
                        return
                    continue
                if isinstance(item, BaseException):
                    raise item
                yield item
                if isinstance(item, Completion) or (cancel is not None and cancel.is_set()):
                    return
        finally:
            self.cancel()


@dataclass
class _Span:
    """Consecutive steps under one drafting regime, at one batch size: what the governor learns from.
    A step counts for the regime its rows drafted under, catching up included (an eagle3 draft reads the
    features of the plain steps before); the first step's forward verifies the previous regime's drafts."""
    rows: int
    regime: str  # adaptive.REGIMES
    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.steps += 1


def _combine(call: RowCall, parts: list[Any]) -> Any:
    """One call's result from its chunks' results: logits of the kept positions, states of all."""
    if len(parts) == 1:
        return parts[0]
    if call.hidden or call.aux:
        logits = torch.cat([p[0] for p in parts]) if call.keep <= 0 else parts[-1][0]
        return logits, torch.cat([p[1] for p in parts])
    return torch.cat(parts) if call.keep <= 0 else parts[-1]


class BatchEngine:
    def __init__(self, engine: Engine, config: BatchConfig | None = None):
        self.engine, self.config = engine, config or BatchConfig()
        c = self.config
        model = engine.target.model
        self.pool = KVPool(model.config, c.kv_blocks, c.kv_block_size, engine.dtype, next(model.parameters()).device)
        self.runner = PagedRunner(model, self.pool)
        self.scheduler = Scheduler(BlockManager(c.kv_blocks, c.kv_block_size, c.prefix_caching),
                                   SchedulerConfig(c.max_batch, c.max_batch_tokens, c.max_waiting))
        self._cond = threading.Condition()
        self._engine_lock = threading.Lock()  # Engine.start/finish share the router and the pace memory
        self._closed = False
        self.steps = 0  # batched forwards run
        self.rows_per_step: Counter[int] = Counter()  # how many forwards ran with how many rows
        self.rows_per_draft_forward: Counter[int] = Counter()  # the same for the eagle3 drafts' forwards
        self._drafting: list[Handle] = []  # rows waiting on a draft forward
        self.clock = ForwardClock()  # each row's share of a forward: what its loop's pace sees as its verify time
        self.governor = SpecGovernor(explore=c.spec_explore, explore_clear=c.spec_explore_clear,  # how far rows speculate
                                     regimes=REGIMES if c.spec_index_regime else TWO_REGIMES)
        self._span = _Span(rows=1, regime=ALL)
        self._thread = threading.Thread(target=self._run, name="draftwheel-batch", daemon=True)
        self._thread.start()

    def __enter__(self) -> "BatchEngine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def submit(self, prompt: Any, params: SamplingParams | None = None, slice: str = "default",
               chat: bool = False, mode: str | None = None) -> Handle:
        """Check and queue a request (bad input raises here, as `Engine.stream` would; a full queue raises
        QueueFullError)."""
        with self._engine_lock:
            run = self.engine.start(prompt, params, slice, chat, mode)
        handle = Handle(self, run)
        with self._cond:
            if self._closed:
                raise RuntimeError("the batch engine is closed")
            self.scheduler.add(handle.seq)
            self._cond.notify()
        return handle

    def stream(self, prompt: Any, params: SamplingParams | None = None, slice: str = "default", chat: bool = False,
               mode: str | None = None, cancel: threading.Event | None = None) -> Iterator[str | Completion]:
        """`Engine.stream`'s contract, decoded in the batch."""
        yield from self.submit(prompt, params, slice, chat, mode).results(cancel)

    def generate(self, prompts: list[Any], params: SamplingParams | None = None, slice: str = "default",
                 chat: bool = False, mode: str | None = None) -> list[Completion]:
        """Run every prompt, all in the batch at once (waiting for room when the queue is full); in order."""
        handles: list[Handle] = []
        for prompt in prompts:
            while True:
                try:
                    handles.append(self.submit(prompt, params, slice, chat, mode))
                    break
                except QueueFullError:
                    self._wait_for_room()
        return [list(h.results())[-1] for h in handles]

    def stats(self) -> dict[str, int]:
        s, blocks = self.scheduler, self.scheduler.blocks
        return {"running": len(s.running), "waiting": len(s.waiting), "free_blocks": blocks.free_blocks,
                "kv_blocks": blocks.n_blocks, "steps": self.steps,
                "prefix_cache_hit_rate": blocks.hit_tokens / blocks.queried_tokens if blocks.queried_tokens else None}

    def close(self) -> None:
        """Stop the step thread; requests still queued or running end with an error."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _wait_for_room(self) -> None:
        with self._cond:
            self._cond.wait_for(lambda: len(self.scheduler.waiting) < self.scheduler.config.max_waiting
                                or self._closed, timeout=1.0)

    # -- the step thread -------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._closed or self.scheduler.running or self.scheduler.waiting)
                if self._closed:
                    break
            try:
                self._turn()
            except Exception as exc:  # noqa: BLE001 - a bug here fails the requests in flight, not the server
                log.exception("batch engine step failed")
                self._fail_all(exc)
        self._fail_all(RuntimeError("the batch engine closed before the request finished"))

    def _turn(self) -> None:
        """One step: drop cancelled requests, admit waiting ones, run one forward for the rows planned."""
        with self._cond:
            self._drop_cancelled()
            admitted = self.scheduler.admit()
            self._cond.notify_all()  # room in the queue
        now = time.perf_counter()
        for seq in admitted:
            handle = seq.payload
            # The record times decoding, as one at a time: its clock restarts at admission.
            handle.queued_s, handle.run.start, handle.run.ts = now - handle.run.start, now, time.time()
            self._observe("observe_queue", handle.queued_s)
            if seq.prompt is not None and self.config.prefix_caching:
                self._observe("observe_prefix", len(seq.prompt), seq.cached)
            handle.run.req.regime = self._span.regime
            run = handle.run
            drafter = BatchDrafter(run.draft.model) if run.mode in ("draft", "hybrid") and run.draft is not None \
                and run.draft.kind == "eagle3" else None
            handle.loop = self.engine.decode(run, handle.row, drafter)
            self._advance(handle, None)
        self._run_drafts()
        plan = self.scheduler.plan()
        if plan:
            self._step(plan)

    def _run_drafts(self) -> None:
        """Run the eagle3 drafts' forwards the rows wait on, one forward per draft model for all of its
        rows, until every row waits on the target again (a chain of k tokens takes k rounds). Their time
        counts in the current span: the governor weighs drafting at its whole cost."""
        if not self._drafting:
            return
        began = time.perf_counter()
        while self._drafting:
            waiting, self._drafting = self._drafting, []
            groups: dict[int, list[Handle]] = {}
            for handle in waiting:
                if not handle.cancelled:
                    groups.setdefault(id(handle.run.draft.model), []).append(handle)
            for group in groups.values():
                calls = [handle.draft_call for handle in group]
                start = time.perf_counter()
                try:
                    results = group[0].run.draft.model.extend_many(calls)
                except Exception as exc:  # noqa: BLE001 - a failed draft forward fails its rows, not the server
                    log.exception("batched draft forward over %d rows failed", len(group))
                    for handle in group:
                        self._fail(handle, exc)
                    continue
                seconds = time.perf_counter() - start
                slots = sum(call.token_ids.shape[0] for call in calls)
                self.rows_per_draft_forward[len(group)] += 1
                for handle, call, (hidden, logits) in zip(group, calls, results):
                    handle.draft_call = None
                    self._advance(handle, (hidden, logits, seconds * call.token_ids.shape[0] / slots))
        self._span.seconds += time.perf_counter() - began

    def _drop_cancelled(self) -> None:
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            if seq.payload.cancelled:
                self._release(seq.payload)

    def _release(self, handle: Handle) -> None:
        if handle.loop is not None:
            try:
                handle.loop.close()
            except Exception:  # noqa: BLE001 - the request ends either way
                log.exception("closing a request's loop failed")
        with self._cond:
            self.scheduler.remove(handle.seq)

    def _step(self, plan: list[tuple[Sequence, int]]) -> None:
        began = time.perf_counter()
        chunks = []
        for seq, n in plan:
            call, fed = seq.payload.call, len(seq.payload.call.tokens) - seq.pending
            final = n == seq.pending
            chunks.append(RowCall(call.tokens[fed:fed + n], seq.length, seq.table, call.keep if final else 1,
                                  call.hidden, call.aux, call.tree))
        try:
            self.runner.forward(chunks)
        except Exception as exc:  # noqa: BLE001 - a failed forward fails its rows, not the server
            log.exception("batched forward over %d rows failed", len(plan))
            for seq, _ in plan:
                self._fail(seq.payload, exc)
            return
        self.steps += 1
        self.rows_per_step[len(plan)] += 1
        tokens, seconds = sum(n for _, n in plan), self.runner.last_forward_s
        self.clock.observe(tokens, seconds)
        self._observe("observe_step", len(plan), tokens)
        self._next_span()
        emitted_before = {seq: len(seq.payload.run.req.out.token_ids) for seq, _ in plan if not seq.prefilling}
        prompt_tokens = sum(n for seq, n in plan if seq.prefilling)
        for (seq, n), chunk in zip(plan, chunks):
            handle = seq.payload
            seq.length += n
            seq.pending -= n
            handle.parts.append(chunk.result)
            handle.row.last_forward_s = self.clock.share(n, len(plan), tokens, seconds)
            handle.run.req.batch_rows = len(plan)  # the load its hybrid pace reads (adaptive.LoadPaces)
            if seq.pending == 0:
                result, handle.parts = _combine(handle.call, handle.parts), []
                if seq.prefilling and seq.prompt is not None:
                    self.scheduler.blocks.register(seq.table, seq.prompt)  # later prompts may share it
                seq.prefilling = False
                self._advance(handle, result)
        # What the decoding rows emitted, in the step's time less the prompts' share of the forward.
        emitted = sum(len(seq.payload.run.req.out.token_ids) - n for seq, n in emitted_before.items())
        prompt_s = self.clock.share(prompt_tokens, len(plan), tokens, seconds) if prompt_tokens else 0.0
        self._span.add(emitted, time.perf_counter() - began - prompt_s)

    def _next_span(self) -> None:
        """Close a full span of steps into the governor and set the next span's regime on every row: the
        drafts made from here on obey it."""
        span, rows = self._span, len(self.scheduler.running)
        if span.steps < self.governor.span and self.governor.bucket(span.rows) == self.governor.bucket(rows):
            return
        if span.steps and span.rows > 1:
            self.governor.observe(span.rows, span.regime, span.tokens, span.seconds)
        self._span = _Span(rows, self.governor.regime(rows))
        for seq in self.scheduler.running:
            seq.payload.run.req.regime = self._span.regime

    def _advance(self, handle: Handle, value: Any) -> None:
        """Resume the request's loop with `value` until it asks for the next forward or ends."""
        seq = handle.seq
        try:
            while True:
                item = handle.loop.send(value)
                value = None
                if isinstance(item, RowCall):
                    # the first call is the whole prompt: a shared prefix of it is in the KV already
                    handle.call, seq.pending = item, item.tokens.shape[0] - (seq.cached if seq.prefilling else 0)
                    if seq.pending <= 0:
                        raise RuntimeError(f"a forward call with nothing to feed ({item.tokens.shape[0]} tokens)")
                    seq.keep = item.keep if item.keep > 0 else 1
                    req = handle.run.req
                    handle.capped_at = len(req.steps) if req.regime != ALL else None
                    return
                if isinstance(item, DraftCall):  # run with the other rows' (_run_drafts)
                    handle.draft_call = item
                    self._drafting.append(handle)
                    return
                steps = handle.run.req.steps  # a step ended: say so when load made it a plain one
                if handle.capped_at is not None and len(steps) > handle.capped_at and steps[-1].k == 0 \
                        and steps[-1].source is None:
                    steps[-1].source = LOAD
                stable = handle.run.req.out.stable_text()  # hand out its stable text
                if len(stable) > handle.sent:
                    handle.items.put(stable[handle.sent:])
                    handle.sent = len(stable)
        except StopIteration:
            with self._cond:
                self.scheduler.remove(seq)
            try:
                with self._engine_lock:
                    handle.items.put(self.engine.finish(handle.run))
            except Exception as exc:  # noqa: BLE001 - handed to the caller
                handle.items.put(exc)
        except Exception as exc:  # noqa: BLE001 - one request's failure is its own
            log.exception("request failed in the batch")
            self._fail(handle, exc)

    def _fail(self, handle: Handle, exc: BaseException) -> None:
        self._release(handle)
        handle.items.put(exc)

    def _fail_all(self, exc: BaseException) -> None:
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            self._fail(seq.payload, exc)

    def _observe(self, name: str, *values: Any) -> None:
        """Optional scheduler metrics: the engine's metrics object may have `observe_step(rows, tokens)`,
        `observe_queue(seconds)` and `observe_prefix(prompt_tokens, cached_tokens)`
        (draftwheel.serving.server.metrics does)."""
        hook = getattr(self.engine.metrics, name, None)
        if hook is not None:
            hook(*values)
