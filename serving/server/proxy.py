"""`draftwheel proxy`: an OpenAI-compatible pass-through that logs what another server served.

`create_proxy_app(config, sink)` forwards `POST /v1/completions` and `POST /v1/chat/completions` (streamed
or not) and `GET /v1/models[/ID]` to `config.upstream` (vLLM, SGLang, draftwheel serve: anything that
speaks the OpenAI API) and hands the response back as the upstream sent it: status, body bytes, content
type, one SSE event at a time while streaming. It asks for the per-request speculative figures where the
API has a way to: a streamed request without `stream_options.include_usage` is sent upstream with it set,
since vLLM puts `metrics.speculative_decoding` on the final usage chunk only, and that chunk (which this
client did not ask for) is kept from the client. vLLM sends the figures only when started with
`--per-request-spec-decode-metrics summary` (draftwheel serve does by default); without them the record
still carries the text.

Every successful single-sequence exchange becomes one acceptance record (`draftwheel.serving.server.exchange`:
`source` = `config.source`, default `proxy:HOST:PORT` of the upstream; no steps) written through the
engine's `JsonlSink`; a request the upstream refused, a stream cut before its end, or an exchange that gives
no record (n > 1, a chat request with no tokenizer to render its prompt) is counted by kind on `/healthz`
and forwarded all the same. The proxy never changes what the client gets beyond that usage chunk, never
retries, and holds no model: only the target's tokenizer, for chat templates.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from draftwheel.serving.engine.records import ModelId
from draftwheel.serving.server.exchange import SLICE_HEADER, ExchangeError, parse_event, record_from_exchange
from draftwheel.serving.server.openai_api import ApiError

log = logging.getLogger(__name__)

# Not forwarded either way: per-connection headers, and lengths/encodings httpx and uvicorn set themselves.
_HOP = {"host", "connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
        "content-length", "content-encoding", "accept-encoding"}


@dataclass
class ProxyConfig:
    """`draftwheel proxy` settings (flags only)."""

    upstream: str
    """Base URL of the OpenAI-compatible server, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)."""
    host: str = "127.0.0.1"
    port: int = 8001
    log_dir: str | None = None
    """Where the acceptance records go; None = $DRAFTWHEEL_HOME/logs."""
    source: str = ""
    """The records' `source`; "" = proxy:HOST:PORT of the upstream."""
    timeout_s: float = 600.0
    """Longest wait for the upstream's next bytes."""

    def __post_init__(self) -> None:
        parts = urlsplit(self.upstream)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"upstream: expected an http(s) URL such as http://127.0.0.1:8000, got {self.upstream!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port: invalid value {self.port!r}")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0, got {self.timeout_s!r}")

    @property
    def base_url(self) -> str:
        """The upstream's URL without a trailing `/` or `/v1` (routes are appended as the client sent them)."""
        url = self.upstream.rstrip("/")
        return url[:-3] if url.endswith("/v1") else url

    @property
    def record_source(self) -> str:
        return self.source or f"proxy:{urlsplit(self.upstream).netloc}"


class _Recorder:
    """Turns finished exchanges into records and counts what it could not record, by kind."""

    def __init__(self, sink: Any, source: str, tokenizer: Any, draft_id: ModelId | None):
        self.sink, self.source, self.tokenizer, self.draft_id = sink, source, tokenizer, draft_id
        self.recorded = 0
        self.skipped: Counter[str] = Counter()

    def record(self, payload: Any, response: Any, header_slice: str | None, ts: float, ttft_s: float,
               latency_s: float) -> None:
        try:
            record = record_from_exchange(payload, response, source=self.source, tokenizer=self.tokenizer,
                                          header_slice=header_slice, draft_id=self.draft_id, ts=ts, ttft_s=ttft_s,
                                          latency_s=latency_s)
        except ExchangeError as exc:
            self.skipped[exc.kind] += 1
            log.info("not recorded (%s): %s", exc.kind, exc)
            return
        if self.sink.write(record):
            self.recorded += 1
        else:
            self.skipped["log_write_failed"] += 1


def _forward_headers(headers: Any) -> dict[str, str]:
    return {name: value for name, value in headers.items() if name.lower() not in _HOP}


def _split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Complete SSE events (each with its blank-line terminator) and the incomplete rest."""
    events = []
    while True:
        ends = [(i, len(sep)) for sep in (b"\n\n", b"\r\n\r\n") if (i := buffer.find(sep)) >= 0]
        if not ends:
            return events, buffer
        at, size = min(ends)
        events.append(buffer[:at + size])
        buffer = buffer[at + size:]


class _Exchange:
    """One forwarded request: its parsed body, what was asked upstream, and the clock."""

    def __init__(self, body: bytes, headers: Any):
        self.start, self.clock = time.time(), time.perf_counter()
        self.header_slice = headers.get(SLICE_HEADER)
        try:
            self.payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            self.payload = None
        self.body = body
        payload = self.payload if isinstance(self.payload, dict) else {}
        self.stream = payload.get("stream") is True
        options = payload.get("stream_options")
        self.injected = self.stream and not (isinstance(options, dict) and options.get("include_usage") is True)
        if self.injected:  # vLLM sends the speculative figures on the usage chunk only: ask for it
            asked = {**payload, "stream_options": {**(options if isinstance(options, dict) else {}),
                                                   "include_usage": True}}
            self.body = json.dumps(asked, ensure_ascii=False).encode("utf-8")

    def elapsed(self) -> float:
        return time.perf_counter() - self.clock


def create_proxy_app(config: ProxyConfig, sink: Any, tokenizer: Any = None, draft_id: ModelId | None = None,
                     transport: httpx.AsyncBaseTransport | None = None) -> FastAPI:
    """The pass-through app; `sink` (a JsonlSink) takes the records, `tokenizer` renders chat prompts,
    `draft_id` names the draft the upstream runs (kept on records with speculative figures), `transport`
    replaces the network (tests)."""
    recorder = _Recorder(sink, config.record_source, tokenizer, draft_id)
    client = httpx.AsyncClient(base_url=config.base_url, transport=transport,
                               timeout=httpx.Timeout(config.timeout_s, connect=min(config.timeout_s, 10.0)))

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await client.aclose()

    app = FastAPI(title="draftwheel proxy", lifespan=lifespan)
    app.state.recorder = recorder

    async def send(method: str, path: str, request: Request, body: bytes = b"") -> httpx.Response:
        upstream = client.build_request(method, path, content=body or None, headers=_forward_headers(request.headers),
                                        params=request.query_params)
        try:
            return await client.send(upstream, stream=True)
        except httpx.HTTPError as exc:
            recorder.skipped["upstream_unreachable"] += 1
            raise ApiError(502, f"upstream {config.base_url} unreachable: {type(exc).__name__}: {exc}",
                           kind="upstream_error", code="bad_gateway") from exc

    async def relay_stream(exchange: _Exchange, response: httpx.Response) -> AsyncIterator[bytes]:
        """The upstream's events as they come, each held back until the next one arrives, so the record is
        written before the client sees the end of the stream (a client may read the log right after)."""
        chunks: list[Any] = []
        ttft = 0.0
        buffer, held, readable = b"", b"", True
        try:
            async for data in response.aiter_bytes():
                events, buffer = _split_events(buffer + data)
                for event in events:
                    try:
                        chunk = parse_event(event)
                    except ExchangeError:
                        chunk, readable = None, False
                    if isinstance(chunk, dict):
                        chunks.append(chunk)
                        if not ttft and chunk.get("choices"):
                            ttft = exchange.elapsed()
                        if exchange.injected and chunk.get("choices") == [] and "usage" in chunk:
                            continue  # the usage chunk the client did not ask for
                    if held:
                        yield held
                    held = event
        except BaseException:
            recorder.skipped["stream_cut"] += 1
            raise
        else:
            if not readable:
                recorder.skipped["not_an_object"] += 1
            else:
                recorder.record(exchange.payload, chunks, exchange.header_slice, exchange.start, ttft,
                                exchange.elapsed())
        finally:
            await response.aclose()
        yield held + buffer

    async def forward(path: str, request: Request) -> Response:
        exchange = _Exchange(await request.body(), request.headers)
        response = await send("POST", path, request, exchange.body)
        headers = _forward_headers(response.headers)
        streamed = response.headers.get("content-type", "").startswith("text/event-stream")
        if response.status_code == 200 and streamed:
            return StreamingResponse(relay_stream(exchange, response), status_code=200, headers=headers)
        content = await response.aread()
        await response.aclose()
        if response.status_code != 200:
            recorder.skipped["upstream_error"] += 1
        else:
            try:
                body = json.loads(content)
            except (json.JSONDecodeError, UnicodeDecodeError):
                body = None
            recorder.record(exchange.payload, body, exchange.header_slice, exchange.start, 0.0, exchange.elapsed())
        return Response(content, status_code=response.status_code, headers=headers)

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await forward("/v1/completions", request)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await forward("/v1/chat/completions", request)

    @app.get("/v1/models")
    @app.get("/v1/models/{model_id:path}")
    async def models(request: Request) -> Response:
        response = await send("GET", request.url.path, request)
        content = await response.aread()
        await response.aclose()
        return Response(content, status_code=response.status_code, headers=_forward_headers(response.headers))

    @app.get("/healthz")
    async def healthz() -> dict[str, Any]:
        sink_log = sink.health() if hasattr(sink, "health") else None
        return {"status": "degraded" if sink_log and sink_log["failing"] else "ok", "upstream": config.base_url,
                "source": recorder.source, "recorded": recorder.recorded, "not_recorded": dict(recorder.skipped),
                "chat_template": bool(getattr(tokenizer, "chat_template", None)), "log": sink_log}

    return app
