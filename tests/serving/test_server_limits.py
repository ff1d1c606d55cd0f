"""The server's guards over HTTP, on tiny models: request size limits (413 before any tokenising), bad text
and loose JSON types (400, OpenAI error body, streaming or not), a failing acceptance log reported on
/healthz and /metrics, and the shutdown drain cutting what it cannot finish."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest


from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.server.metrics import Metrics
from draftwheel.serving.server.app import ServeConfig, background_server, create_app
from draftwheel.serving.engine.sink import JsonlSink
from tests.serving.test_server import model_dirs  # noqa: F401 - a fixture

NAME = "tiny"


@pytest.fixture(scope="module")
def engine(model_dirs):  # noqa: F811 - the imported fixture
    return engine_from_specs(*model_dirs, metrics=Metrics())


@pytest.fixture(scope="module")
def url(engine):
    with background_server(create_app(engine, ServeConfig(served_model_name=NAME, max_prompt_chars=5000))) as base:
        yield base


def _error(response: httpx.Response, status: int) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json"), response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def _post_raw(url: str, path: str, text: str, **kwargs) -> httpx.Response:
    """POST JSON text as written (so `\\ud800` escapes reach the server as they are)."""
    return httpx.post(url + path, content=text.encode(), headers={"content-type": "application/json"},
                      timeout=60, **kwargs)


def test_a_body_over_the_limit_is_refused_before_tokenising(url):
    """2 MiB of prompt against the default 1 MiB limit: a 413 at once, not a 400 after tokenising it."""
    body = json.dumps({"model": NAME, "prompt": "word " * (2 * 1024 * 1024 // 5)})
    start = time.monotonic()
    error = _error(_post_raw(url, "/v1/completions", body), 413)
    assert time.monotonic() - start < 5
    assert "max_body_bytes" in error["message"] and error["code"] == "request_too_large"


def test_a_chunked_body_without_a_length_is_counted_too(url):
    def chunks():
        yield b'{"model": "tiny", "prompt": "'
        for _ in range(40):
            yield b"x" * 65536
        yield b'"}'

    response = httpx.post(url + "/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                          timeout=60)
    assert _error(response, 413)["code"] == "request_too_large"


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/completions", {"prompt": "y" * 5001}, "prompt"),
    ("/v1/completions", {"prompt": ["y" * 3000, "z" * 3000]}, "prompt"),
    ("/v1/completions", {"prompt": "y" * 5001, "stream": True}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "y" * 3000},
                                           {"role": "user", "content": [{"type": "text", "text": "z" * 3000}]}]},
     "messages"),
])
def test_prompts_over_max_prompt_chars_get_413(url, path, body, field):
    error = _error(httpx.post(url + path, json={"model": NAME, **body}, timeout=60), 413)
    assert error["param"] == field and "max_prompt_chars" in error["message"] and error["code"] == "prompt_too_long"


@pytest.mark.parametrize("stream", ["false", "true"])
@pytest.mark.parametrize(("path", "payload", "field"), [
    ("/v1/completions", '"prompt": "a\\ud800b"', "prompt"),
    ("/v1/chat/completions", '"messages": [{"role": "user", "content": "\\ud800"}]', "messages.0.content"),
])
def test_a_lone_surrogate_gets_a_400_with_the_openai_body(url, stream, path, payload, field):
    text = f'{{"model": "{NAME}", "max_tokens": 2, "stream": {stream}, {payload}}}'
    error = _error(_post_raw(url, path, text), 400)
    assert error["param"] == field and "lone surrogate U+D800" in error["message"]


@pytest.mark.parametrize(("field", "value"), [("stream", '"yes"'), ("max_tokens", '"2"'),
                                              ("temperature", '"0"'), ("n", "true")])
def test_loose_json_types_get_a_400_naming_the_field(url, field, value):
    text = f'{{"model": "{NAME}", "prompt": "hi", "{field}": {value}}}'
    assert _error(_post_raw(url, "/v1/completions", text), 400)["message"].startswith(f"{field}: ")


def test_a_failing_log_shows_on_healthz_and_metrics(model_dirs, tmp_path):  # noqa: F811
    metrics = Metrics()
    log_dir = tmp_path / "logs"
    sink = JsonlSink(log_dir, metrics=metrics)
    engine = engine_from_specs(*model_dirs, sink=sink, metrics=metrics)
    with background_server(create_app(engine, ServeConfig(served_model_name=NAME))) as base:
        health = httpx.get(base + "/healthz").json()
        assert health["status"] == "ok" and health["log"]["write_errors"] == 0
        (log_dir / "acceptance.jsonl").mkdir()  # the active file can no longer be opened (even as root)
        for _ in range(2):
            httpx.post(base + "/v1/completions", json={"model": NAME, "prompt": "hi", "max_tokens": 2}, timeout=60)
        health = httpx.get(base + "/healthz").json()
        scraped = httpx.get(base + "/metrics").text
    sink.close()
    assert health["status"] == "degraded"
    assert health["log"]["write_errors"] == 2 and "Is a directory" in health["log"]["last_error"]
    assert health["log"]["dir"] == str(log_dir)
    assert "draftwheel_log_write_errors_total 2.0" in scraped


def test_an_unexpected_error_still_gets_the_openai_body(model_dirs):  # noqa: F811
    engine = engine_from_specs(model_dirs[0], metrics=Metrics())

    def broken(*_, **__):
        raise RuntimeError("tokenizer exploded")

    engine.encode = broken
    with background_server(create_app(engine, ServeConfig(served_model_name=NAME))) as base:
        response = httpx.post(base + "/v1/completions", json={"model": NAME, "prompt": "hi"}, timeout=60)
    assert _error(response, 500)["type"] == "server_error"


def test_shutdown_stops_the_running_engine_job(engine):
    """The lifespan's shutdown (what uvicorn runs after its drain timeout) stops a running engine job at
    its next token instead of letting it run to the end (the process would wait for it to exit)."""
    app = create_app(engine, ServeConfig(served_model_name=NAME))
    started = []

    def job(cancel):
        while True:
            started.append(1)
            yield "token"
            time.sleep(0.01)

    async def run():
        async with app.router.lifespan_context(app):
            items = app.state.worker.iterate(job)
            await items.__anext__()
        at_shutdown = len(started)
        await asyncio.sleep(0.3)
        return at_shutdown, len(started), items

    at_shutdown, later, _ = asyncio.run(run())
    assert later <= at_shutdown + 2, "the job ran on after shutdown"
