"""The HTTP server with `scheduler: batched`, with the official `openai` client, on tiny models.

Concurrent requests decode together (their records' time spans overlap) and get the output one at a
time would give; streaming, the acceptance records and a client hanging up work as with one worker;
a queue over `max_waiting` answers 503 and every request it accepted finishes with its record.
"""

from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from draftwheel.serving.engine.records import parse_record
from draftwheel.serving.engine.sink import JsonlSink, iter_lines
from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.server.app import ServeConfig, background_server, create_app
from draftwheel.serving.server.metrics import Metrics
from tests.serving.test_server import PROMPTS, hf_greedy, model_dirs  # noqa: F401 - a fixture


def serve(model_dirs, log_dir, **config):
    metrics = Metrics()
    sink = JsonlSink(log_dir, flush_every=1, metrics=metrics)
    engine = engine_from_specs(*model_dirs, sink=sink, metrics=metrics)
    return engine, sink, create_app(engine, ServeConfig(served_model_name="tiny", scheduler="batched", **config))


def records(sink):
    return [parse_record(line) for *_, line in iter_lines(sink.log_dir)]


def concurrently(calls):
    results, errors = [None] * len(calls), []

    def run(i, call):
        try:
            results[i] = call()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results, errors


@pytest.fixture(scope="module")
def stack(model_dirs, tmp_path_factory):
    engine, sink, app = serve(model_dirs, tmp_path_factory.mktemp("logs"))
    with background_server(app) as url:
        yield engine, sink, url
    sink.close()


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack[2] + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_concurrent_requests_decode_together_and_equal_greedy_decoding(stack, client):
    engine, sink, url = stack

    def call(prompt, stream):
        kwargs = dict(model="tiny", prompt=prompt, max_tokens=24, temperature=0)
        if stream:
            return "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs))
        return client.completions.create(**kwargs).choices[0].text

    texts, errors = concurrently([lambda p=p, i=i: call(p, i % 2 == 1) for i, p in enumerate(PROMPTS * 2)])
    assert not errors
    done = records(sink)[-8:]
    assert sorted(r.output for r in done) == sorted(texts)
    for record in done:  # each the target's greedy decode, batched or not
        assert record.output_token_ids == hf_greedy(engine, record.prompt_token_ids, 24)
    spans = sorted((r.ts, r.ts + r.latency_s) for r in done)
    assert any(later[0] < earlier[1] for earlier, later in zip(spans, spans[1:])), "no two requests overlapped"
    health = httpx.get(url + "/healthz").json()
    assert health["batch"]["running"] == 0 and health["batch"]["free_blocks"] == health["batch"]["kv_blocks"]


def test_chat_streams_with_usage(stack, client):
    messages = [{"role": "user", "content": "Hello! How can"}]
    full = client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 12


def test_a_client_that_hangs_up_frees_its_blocks(stack, client):
    body = {"model": "tiny", "prompt": "cancel me", "max_tokens": 800, "temperature": 0, "stream": True}
    with httpx.stream("POST", stack[2] + "/v1/completions", json=body) as response:
        next(response.iter_lines())
    deadline = time.monotonic() + 20
    while httpx.get(stack[2] + "/healthz").json()["batch"]["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    batch = httpx.get(stack[2] + "/healthz").json()["batch"]
    assert batch["running"] == 0 and batch["free_blocks"] == batch["kv_blocks"]
    assert "cancel me" not in [r.prompt for r in records(stack[1])]


def test_overload_gets_503_and_loses_nothing_accepted(model_dirs, tmp_path):
    """One row, room in the pool for one request and one waiting: of 8 concurrent requests the ones over the
    queue get a 503 with Retry-After; every accepted one finishes with its record."""
    engine, sink, app = serve(model_dirs, tmp_path, max_batch=1, max_waiting=1, kv_blocks=20, kv_block_size=4)
    with background_server(app) as url:
        def call(prompt):
            response = httpx.post(url + "/v1/completions", timeout=60,
                                  json={"model": "tiny", "prompt": prompt, "max_tokens": 40, "temperature": 0})
            return response.status_code, response.headers.get("retry-after"), response.json()

        answers, errors = concurrently([lambda p=p: call(p) for p in PROMPTS * 2])
        assert not errors
        ok = [body for status, _, body in answers if status == 200]
        busy = [(retry, body) for status, retry, body in answers if status == 503]
        assert ok and busy and len(ok) + len(busy) == 8
        assert all(retry == "1" and body["error"]["code"] == "server_busy" for retry, body in busy)
        assert len(records(sink)) == len(ok)
        assert sorted(r.output for r in records(sink)) == sorted(b["choices"][0]["text"] for b in ok)
        too_big = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "Hi", "max_tokens": 200})
        assert too_big.status_code == 400 and "kv_blocks" in too_big.json()["error"]["message"]
    sink.close()


def test_metrics_show_batches_queue_time_and_tpot(stack, client):
    _, _, url = stack
    before = httpx.get(url + "/metrics").text
    texts, errors = concurrently([lambda p=p: client.completions.create(model="tiny", prompt=p, max_tokens=8,
                                                                        temperature=0) for p in PROMPTS])
    assert not errors

    def value(text, name):
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))

    after = httpx.get(url + "/metrics").text
    assert value(after, "draftwheel_queue_time_seconds_count") - value(before, "draftwheel_queue_time_seconds_count") == 4
    assert value(after, "draftwheel_tpot_seconds_count") - value(before, "draftwheel_tpot_seconds_count") == 4
    forwards = value(after, "draftwheel_batch_rows_count") - value(before, "draftwheel_batch_rows_count")
    rows = value(after, "draftwheel_batch_rows_sum") - value(before, "draftwheel_batch_rows_sum")
    assert 0 < forwards < rows  # some forwards served several requests
