"""ASGI middleware that guards the HTTP server before any route runs, and the drain counter it feeds.

`BodyLimit` refuses a request body over `max_bytes` with a 413 and the OpenAI error body: at once when
`Content-Length` says so, else as soon as the streamed (chunked) body passes the limit, so an oversized
body is never parsed, let alone tokenised on the engine thread. `DrainCounter` + `InFlight` count the
HTTP requests in flight; after uvicorn's drain timeout (`ServeConfig.drain_timeout_s`) the ones still in
flight, or cancelled by uvicorn, are the requests the shutdown cut.

Not here: routing, auth and per-field checks (`draftwheel.serving.server.app`, `draftwheel.serving.server.openai_api`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from fastapi.responses import JSONResponse

from draftwheel.serving.server.openai_api import ApiError

Scope = dict[str, Any]


def _header(scope: Scope, name: bytes) -> str | None:
    return next((value.decode("latin-1") for key, value in scope.get("headers", ()) if key.lower() == name), None)


class BodyLimit:
    """Buffers a request body of at most `max_bytes` and replays it to the app; larger bodies get a 413."""

    def __init__(self, app: Any, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(scope, receive, send, f"{declared} bytes")
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client went away mid-body
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._refuse(scope, receive, send, f"more than {self.max_bytes} bytes")
            more = message.get("more_body", False)
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: disconnect notices for streaming responses
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        return await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Any, send: Any, size: str) -> None:
        error = ApiError(413, f"request body: {size}, over the server's limit of {self.max_bytes} bytes "
                              f"(max_body_bytes)", code="request_too_large")
        await JSONResponse(error.body(), status_code=413, headers={"connection": "close"})(scope, receive, send)


@dataclass
class DrainCounter:
    """HTTP requests in flight now, and those uvicorn cancelled when its drain timeout passed."""

    active: int = 0
    cancelled: int = 0

    @property
    def cut(self) -> int:
        """Requests the shutdown did not let finish (read once the server stopped serving)."""
        return self.active + self.cancelled


class InFlight:
    """Counts every HTTP request into a `DrainCounter` while the app handles it (streaming included)."""

    def __init__(self, app: Any, counter: DrainCounter) -> None:
        self.app, self.counter = app, counter

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        self.counter.active += 1
        try:
            return await self.app(scope, receive, send)
        except asyncio.CancelledError:
            # Only uvicorn cancels a request's task, when its drain timeout passed: count the request and
            # end the task quietly (re-raised, uvicorn would log it as a crash with a traceback).
            self.counter.cancelled += 1
        finally:
            self.counter.active -= 1
