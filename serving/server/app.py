"""The OpenAI-compatible HTTP server: `create_app(engine, config) -> FastAPI`.

Routes: `POST /v1/completions`, `POST /v1/chat/completions` (both streaming over SSE or not),
`GET /v1/models`, `GET /metrics` (Prometheus text from the engine's `Metrics`), `GET /healthz` (target
and draft ids; the acceptance log's counts, `status: "degraded"` while its writes fail). With `config.api_key` set, `/v1/*` needs `Authorization: Bearer <key>` (401 otherwise);
`/metrics` and `/healthz` stay open for scrapers and probes. Each completion carries the request's
speculative figures as vLLM returns them, `metrics.speculative_decoding` (`draftwheel.serving.server.spec_metrics`;
`per_request_spec_decode_metrics`).

With `scheduler: batched` (the default) concurrent requests decode together in the batch engine
(draftwheel.serving.engine.batching), whose queue is bounded (`max_waiting`: a 503 with Retry-After
beyond it). With `scheduler: serial` the engine runs one request at a time on a single worker thread;
concurrent HTTP requests wait in its FIFO queue (never dropped; `draftwheel_queue_depth` shows the queue). Bad input gets a 4xx with an
OpenAI-style error body, never a 500 (an unexpected failure is a 500 with that body, never plain text).
Bodies over `max_body_bytes` and prompts over `max_prompt_chars` get a 413 before any tokenising
(`draftwheel.serving.server.http_guard`); on shutdown, running engine jobs stop at their next token and the requests
cut by the drain timeout are counted in the log. The sink and the reload watcher are owned by the caller
(`draftwheel.serving.server.cli`); this module only serves.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager, contextmanager
from dataclasses import asdict
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from draftwheel.serving.server.http_guard import BodyLimit, DrainCounter, InFlight
from draftwheel.serving.server import spec_metrics
from draftwheel.serving.server.metrics import Metrics
from draftwheel.serving.server.openai_api import (
    ApiError, ChatRequest, CompletionRequest, chat_body, chat_chunk, check_supported, check_text, completion_body,
    completion_chunk, new_id, requested_max_tokens, to_sampling_params, usage_chunk,
)
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.scheduler import QueueFullError
from draftwheel.serving.server.serve_config import ServeConfig  # noqa: F401 - re-exported: callers import it from here

log = logging.getLogger(__name__)


_END = object()


class EngineWorker:
    """Runs engine jobs one at a time, FIFO, on one thread (or on `workers` threads, each waiting on its
    request in the batch engine); results come back as async iterators."""

    def __init__(self, metrics: Metrics, workers: int = 1) -> None:
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="draftwheel-engine")
        self._metrics = metrics
        self._jobs: set[threading.Event] = set()  # the cancel flags of the jobs not yet finished

    async def iterate(self, job: Callable[[threading.Event], Iterator[Any]]) -> AsyncIterator[Any]:
        """Queue `job` (a generator factory, handed the job's cancel flag) and yield its items; its exception
        is raised here."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()
        cancelled = threading.Event()
        self._jobs.add(cancelled)
        self._metrics.queue_depth.inc()
        loop.run_in_executor(self._executor, self._pump, job, loop, queue, cancelled)
        try:
            while True:
                item = await queue.get()
                if item is _END:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            cancelled.set()  # a client that went away stops its job at the next item
            self._jobs.discard(cancelled)

    def _pump(self, job: Callable[[threading.Event], Iterator[Any]], loop: asyncio.AbstractEventLoop,
              queue: asyncio.Queue, cancelled: threading.Event) -> None:
        def post(item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, item)
            except RuntimeError:  # the event loop is gone (server shut down)
                cancelled.set()

        try:
            if cancelled.is_set():
                return
            items = job(cancelled)  # checked here per item, and by the engine per step
            try:
                for item in items:
                    post(item)
                    if cancelled.is_set():
                        return
            finally:
                items.close()
            post(_END)
        except BaseException as exc:  # noqa: BLE001 - handed to the request's coroutine
            post(exc)
        finally:
            self._metrics.queue_depth.dec()

    def shutdown(self) -> None:
        """Drop queued jobs and stop running ones at their next item or engine step (else the process waits
        for them: the executor's thread is joined at exit)."""
        for cancelled in list(self._jobs):
            cancelled.set()
        self._executor.shutdown(wait=False, cancel_futures=True)


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


class _Service:
    """Request handling shared by both completion routes."""

    def __init__(self, engine: Any, config: ServeConfig, worker: EngineWorker, runner: Any = None) -> None:
        self.engine, self.config, self.worker = engine, config, worker
        self.runner = runner or engine  # what decodes: the engine itself, or its batch engine
        self.model_name = config.served_model_name or engine.target.model_id.name
        self.defaults = SamplingParams(k=config.k, adaptive_k=config.adaptive_k)

    def validate(self, request: CompletionRequest | ChatRequest) -> None:
        """Everything checkable without tokenising: text, prompt size, model name and parameters."""
        check_text(request)
        self._check_prompt_size(request)
        if request.model != self.model_name:
            raise ApiError(404, f"model: {request.model!r} is not served here; available: {self.model_name!r}",
                           "model", code="model_not_found")
        check_supported(request)
        to_sampling_params(request, requested_max_tokens(request) or 1, self.defaults,
                           self.config.default_temperature)

    def _check_prompt_size(self, request: CompletionRequest | ChatRequest) -> None:
        chat = isinstance(request, ChatRequest)
        texts = [m.as_template_message()["content"] for m in request.messages] if chat else request.prompts()
        chars, limit = sum(map(len, texts)), self.config.max_prompt_chars
        if chars > limit:
            field = "messages" if chat else "prompt"
            raise ApiError(413, f"{field}: {chars} characters, over the server's limit of {limit} (max_prompt_chars)",
                           field, code="prompt_too_long")

    def _context_limit(self) -> int | None:
        draft = self.engine.draft
        models = [self.engine.target.model] + ([draft.model] if draft is not None else [])
        limits = [getattr(m.config, "max_position_embeddings", None) for m in models]
        return min((x for x in limits if x), default=None)

    def _params(self, request: CompletionRequest | ChatRequest, n_prompt: int) -> SamplingParams:
        limit, asked = self._context_limit(), requested_max_tokens(request)
        if limit is not None and n_prompt >= limit:
            raise ApiError(400, f"prompt: {n_prompt} tokens, the model's context is {limit} tokens",
                           "prompt" if isinstance(request, CompletionRequest) else "messages",
                           code="context_length_exceeded")
        if asked is None:
            max_tokens = min(self.config.default_max_tokens, limit - n_prompt if limit else 1 << 30)
        elif limit is not None and n_prompt + asked > limit:
            raise ApiError(400, f"max_tokens: prompt ({n_prompt} tokens) + max_tokens ({asked}) exceeds the "
                                f"model's context of {limit} tokens", "max_tokens", code="context_length_exceeded")
        else:
            max_tokens = asked
        return to_sampling_params(request, max_tokens, self.defaults, self.config.default_temperature)

    def job(self, request: CompletionRequest | ChatRequest, prompt: Any, chat: bool,
            cancel: threading.Event) -> Iterator[Any]:
        """Runs on the worker thread: tokenise, size max_tokens, then stream deltas and the Completion."""
        _, ids = self.engine.encode(prompt, chat)
        params = self._params(request, len(ids))
        yield from self.runner.stream(prompt, params, slice=request.record_slice, chat=chat,
                                      mode=request.mode or self.config.mode, cancel=cancel)

    def run(self, request: CompletionRequest | ChatRequest, prompt: Any, chat: bool) -> AsyncIterator[Any]:
        return self.worker.iterate(lambda cancel: self.job(request, prompt, chat, cancel))

    def spec_metrics(self, request: CompletionRequest | ChatRequest, completions: list[Any]) -> dict[str, Any] | None:
        """The response's `metrics` object as vLLM sends it (`per_request_spec_decode_metrics`; None: not sent):
        `speculative_decoding` from the request's record, null when it was not one speculative stream (several
        prompts, or decoded without speculation)."""
        level = self.config.per_request_spec_decode_metrics
        if level == "none":
            return None
        record = completions[0].record if len(completions) == 1 else None
        if record is None or record.mode == "autoregressive":
            return {"speculative_decoding": None}
        k = self.defaults.k if request.k is None else request.k
        return {"speculative_decoding": spec_metrics.from_record(record, k, detailed=level == "detailed")}

    async def complete(self, request: CompletionRequest) -> dict[str, Any]:
        results = []
        for prompt in request.prompts():
            *_, completion = [item async for item in self.run(request, prompt, chat=False)]
            results.append(completion)
        return completion_body(new_id("cmpl"), self.model_name, [(c.text, c.finish_reason) for c in results],
                               sum(len(c.prompt_token_ids) for c in results), sum(len(c.token_ids) for c in results),
                               self.spec_metrics(request, results))

    async def chat(self, request: ChatRequest) -> dict[str, Any]:
        messages = [m.as_template_message() for m in request.messages]
        *_, completion = [item async for item in self.run(request, messages, chat=True)]
        return chat_body(new_id("chatcmpl"), self.model_name, completion.text, completion.finish_reason,
                         len(completion.prompt_token_ids), len(completion.token_ids),
                         self.spec_metrics(request, [completion]))

    async def stream(self, request: CompletionRequest | ChatRequest) -> StreamingResponse:
        chat = isinstance(request, ChatRequest)
        prompt = [m.as_template_message() for m in request.messages] if chat else request.prompts()[0]
        items = self.run(request, prompt, chat)
        first = await items.__anext__()  # errors before the first token still become a 4xx
        return StreamingResponse(self._events(request, chat, first, items), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    async def _events(self, request: Any, chat: bool, first: Any, items: AsyncIterator[Any]) -> AsyncIterator[str]:
        rid, model = new_id("chatcmpl" if chat else "cmpl"), self.model_name

        def chunk(text: str | None, finish: str | None) -> str:
            if chat:
                return _sse(chat_chunk(rid, model, {} if text is None else {"content": text}, finish))
            return _sse(completion_chunk(rid, model, text or "", finish))

        try:
            if chat:
                yield _sse(chat_chunk(rid, model, {"role": "assistant", "content": ""}, None))
            sent, item = "", first
            while isinstance(item, str):
                sent += item
                yield chunk(item, None)
                item = await items.__anext__()
            # The final text may hold a tail the engine kept back (a possible stop-string prefix).
            if item.text.startswith(sent) and len(item.text) > len(sent):
                yield chunk(item.text[len(sent):], None)
            yield chunk(None, item.finish_reason)
            if request.include_usage:
                yield _sse(usage_chunk(rid, model, chat, len(item.prompt_token_ids), len(item.token_ids),
                                       self.spec_metrics(request, [item])))
        except Exception as exc:  # noqa: BLE001 - headers are sent; report in-band as OpenAI does
            log.exception("stream %s failed", rid)
            error = exc if isinstance(exc, ApiError) else ApiError(500, f"generation failed: {exc}",
                                                                   kind="server_error")
            yield _sse(error.body())
        finally:
            await items.aclose()
        yield "data: [DONE]\n\n"


_UNION_TAG = re.compile(r"str|int|float|bool|(list|dict)\[.*\]|[A-Z]\w*")


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        return f"malformed JSON body: {first.get('ctx', {}).get('error', first['msg'])}", None
    # Drop the body marker and pydantic's union-member tags ("str", "list[str]") from the path.
    loc = [str(p) for p in first.get("loc", ()) if p != "body" and not _UNION_TAG.fullmatch(str(p))]
    field = ".".join(loc) or None
    if field is None and first.get("type") == "missing":
        return "request body: expected a JSON object", None
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return f"{field or 'request'}: {first['msg']}{more}", field


def _install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(_: Request, exc: RequestValidationError) -> JSONResponse:
        message, field = _validation_message(exc)
        return JSONResponse(ApiError(400, message, field).body(), status_code=400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(ApiError(exc.status_code, str(exc.detail)).body(), status_code=exc.status_code)

    @app.exception_handler(QueueFullError)
    async def busy(_: Request, exc: QueueFullError) -> JSONResponse:
        return JSONResponse(ApiError(503, str(exc), kind="server_error", code="server_busy").body(), status_code=503,
                            headers={"Retry-After": "1"})

    @app.exception_handler(ValueError)
    async def value_error(_: Request, exc: ValueError) -> JSONResponse:
        # Engine-side input checks (prompt too long, empty prompt, no chat template, ...).
        return JSONResponse(ApiError(400, str(exc)).body(), status_code=400)

    @app.exception_handler(Exception)
    async def server_error(_: Request, exc: Exception) -> JSONResponse:
        # A bug, not bad input: still the OpenAI body, so clients parse it (the traceback goes to the log).
        error = ApiError(500, f"internal error: {type(exc).__name__}", kind="server_error")
        return JSONResponse(error.body(), status_code=500)


def _ensure_metrics(engine: Any) -> Metrics:
    # /metrics serves the engine's registry; an engine built without one gets one here so the
    # counters the engine publishes and the ones served are the same object.
    if getattr(engine, "metrics", None) is None:
        engine.metrics = Metrics()
    return engine.metrics


def _batch_engine(engine: Any, config: ServeConfig) -> Any:
    from draftwheel.serving.engine.batching import BatchEngine

    return BatchEngine(engine, config.batch_config())


def create_app(engine: Any, config: ServeConfig | None = None, watcher: Any = None) -> FastAPI:
    """The FastAPI app serving `engine` (a `draftwheel.serving.engine.engine.Engine`); `watcher`, a running
    `draftwheel.serving.server.reload.DraftWatcher` if any, is only reported on /healthz."""
    config = config or ServeConfig()
    metrics = _ensure_metrics(engine)
    runner = _batch_engine(engine, config) if config.scheduler == "batched" else engine
    worker = EngineWorker(metrics, 1 if runner is engine else config.max_batch + config.max_waiting + 8)
    service = _Service(engine, config, worker, runner)
    started = int(time.time())
    drain = DrainCounter()

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        worker.shutdown()
        if runner is not engine:
            runner.close()
        if drain.cut:
            log.warning("shutdown: the drain timeout (%g s) passed; %d request(s) in flight were cut",
                        config.drain_timeout_s, drain.cut)

    app = FastAPI(title="draftwheel", lifespan=lifespan)
    app.state.worker, app.state.drain = worker, drain
    _install_error_handlers(app)

    @app.middleware("http")
    async def require_key(request: Request, call_next: Callable) -> Response:
        if config.api_key and request.url.path.startswith("/v1/"):
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), config.api_key.encode()):
                error = ApiError(401, "invalid or missing API key: send 'Authorization: Bearer <key>'",
                                 kind="authentication_error", code="invalid_api_key")
                return JSONResponse(error.body(), status_code=401)
        return await call_next(request)

    app.add_middleware(BodyLimit, max_bytes=config.max_body_bytes)
    app.add_middleware(InFlight, counter=drain)  # the outermost: it sees uvicorn cancel a request

    @app.post("/v1/completions")
    async def completions(request: CompletionRequest) -> Any:
        service.validate(request)
        return await (service.stream(request) if request.stream else service.complete(request))

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatRequest) -> Any:
        service.validate(request)
        return await (service.stream(request) if request.stream else service.chat(request))

    model_card = {"id": service.model_name, "object": "model", "created": started, "owned_by": "draftwheel"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [model_card]}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        if model_id != service.model_name:
            raise ApiError(404, f"model: {model_id!r} is not served here", "model", code="model_not_found")
        return model_card

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        draft = engine.draft
        sink_log = engine.sink.health() if hasattr(engine.sink, "health") else None
        # 200 either way: the server still serves; "degraded" says its records are being lost.
        status = "degraded" if sink_log and sink_log["failing"] else "ok"
        return {"status": status, "log": sink_log, "model": service.model_name, "mode": engine.default_mode,
                "target": asdict(engine.target.model_id),
                "draft": asdict(draft.model_id) if draft is not None else None,
                "medusa": engine.medusa is not None,
                "suffix_index": engine.suffix_index.stats() if engine.suffix_index is not None else None,
                "queue_depth": int(metrics.value("draftwheel_queue_depth")),
                "batch": runner.stats() if runner is not engine else None,
                "reload": None if watcher is None else {
                    "uri": watcher.uri, "current_version": watcher.current_version, "swaps": watcher.swaps,
                    "last_error": watcher.last_error}}

    return app


@contextmanager
def background_server(app: FastAPI, host: str = "127.0.0.1", start_timeout_s: float = 30.0) -> Iterator[str]:
    """Serve `app` with uvicorn on a free port in a daemon thread; yield its base URL (tests, benchmarks)."""
    import uvicorn

    sock = socket.socket()
    sock.bind((host, 0))  # the kernel picks a free port; handing uvicorn the socket avoids a race
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="uvicorn")
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    try:
        yield f"http://{host}:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
        sock.close()
