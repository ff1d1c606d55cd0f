"""`draftwheel serve` returns `metrics.speculative_decoding` as vLLM does, and `draftwheel proxy` in front of it
records what it says.

A real server (the Engine on a tiny target and a noisy copy of it as the draft, so steps both accept and roll
back) runs in a background thread; so does a proxy in front of it. The block in each response must be the
one the request's own acceptance record gives (draftwheel.serving.server.spec_metrics.from_record), and the
record the proxy writes must carry the same totals.
"""

from __future__ import annotations

import httpx
import openai
import pytest

from draftwheel.serving.engine.records import parse_record
from draftwheel.serving.engine.sink import JsonlSink, iter_lines
from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.server.app import ServeConfig, background_server, create_app
from draftwheel.serving.server.proxy import ProxyConfig, create_proxy_app
from draftwheel.serving.server.spec_metrics import from_record
from tests.serving.test_server import model_dirs  # noqa: F401 - the target and noisy-draft fixture

K = 3


@pytest.fixture(scope="module")
def servers(model_dirs, tmp_path_factory):  # noqa: F811 - the imported fixture
    """(engine, serve sink, proxy sink, serve URL, proxy URL)."""
    root = tmp_path_factory.mktemp("spec-block")
    serve_sink, proxy_sink = JsonlSink(root / "serve", flush_every=1), JsonlSink(root / "proxy", flush_every=1)
    engine = engine_from_specs(*model_dirs, sink=serve_sink)
    app = create_app(engine, ServeConfig(served_model_name="tiny", k=K))
    with background_server(app) as serve_url:
        proxy = create_proxy_app(ProxyConfig(upstream=serve_url), proxy_sink, engine.target.tokenizer)
        with background_server(proxy) as proxy_url:
            yield engine, serve_sink, proxy_sink, serve_url, proxy_url
    serve_sink.close()
    proxy_sink.close()


def records(sink: JsonlSink) -> list:
    return [parse_record(line) for _, _, line in iter_lines(sink.log_dir)]


def test_a_completion_carries_the_block_its_record_gives(servers):
    _, serve_sink, _, url, _ = servers
    body = httpx.post(url + "/v1/completions", json={"model": "tiny", "prompt": "The quick brown", "max_tokens": 24,
                                                     "temperature": 0}, timeout=60).json()
    record = records(serve_sink)[-1]
    block = body["metrics"]["speculative_decoding"]
    assert block == from_record(record, K)
    spec_steps = [s for s in record.steps if s.k]
    assert block["num_draft_tokens"] == record.drafted_tokens > 0
    assert block["num_accepted_draft_tokens"] == record.accepted_tokens
    assert block["num_spec_steps"] == len(spec_steps) and sum(block["acceptance_histogram"]) == len(spec_steps)
    assert 0 < block["draft_acceptance_rate"] < 1, "the noisy draft should both accept and roll back"


def test_a_stream_carries_it_on_the_usage_chunk_only(servers):
    _, serve_sink, _, url, _ = servers
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
    messages = [{"role": "user", "content": "Please write a short"}]
    chunks = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    record = records(serve_sink)[-1]
    with_metrics = [c for c in chunks if getattr(c, "metrics", None)]
    assert with_metrics == [chunks[-1]] and chunks[-1].usage is not None  # as vLLM: the final usage chunk
    assert chunks[-1].metrics["speculative_decoding"] == from_record(record, K)
    plain = list(client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0,
                                                stream=True))
    assert not any(getattr(c, "metrics", None) for c in plain)  # no usage asked for: no figures, as vLLM


def test_levels_and_requests_without_speculation(servers, model_dirs):  # noqa: F811
    engine, serve_sink, _, url, _ = servers
    request = {"model": "tiny", "prompt": "def add(a, b):", "max_tokens": 12, "temperature": 0}
    plain = httpx.post(url + "/v1/completions", json={**request, "mode": "autoregressive"}, timeout=60).json()
    assert plain["metrics"] == {"speculative_decoding": None}
    several = httpx.post(url + "/v1/completions", json={**request, "prompt": ["a b", "c d"]}, timeout=60).json()
    assert several["metrics"] == {"speculative_decoding": None}  # two sequences, as vLLM's n > 1
    for level in ("none", "detailed"):
        app = create_app(engine, ServeConfig(served_model_name="tiny", k=K, per_request_spec_decode_metrics=level))
        with background_server(app) as other:
            body = httpx.post(other + "/v1/completions", json=request, timeout=60).json()
        record = records(serve_sink)[-1]
        if level == "none":
            assert "metrics" not in body
        else:
            block = body["metrics"]["speculative_decoding"]
            assert block["per_step_drafted"] == [s.k for s in record.steps if s.k]
            assert block["per_step_accepted"] == [s.accepted for s in record.steps if s.k]
    with pytest.raises(ValueError, match="per_request_spec_decode_metrics"):
        ServeConfig(per_request_spec_decode_metrics="verbose")


def test_the_proxy_records_what_draftwheel_serve_returned(servers):
    _, serve_sink, proxy_sink, _, proxy_url = servers
    client = openai.OpenAI(base_url=proxy_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    before = len(records(proxy_sink))
    reply = client.completions.create(model="tiny", prompt="import os\n", max_tokens=20, temperature=0,
                                      extra_body={"slice": "code"})
    served = records(serve_sink)[-1]
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Hello! How can"}], max_tokens=12, temperature=0,
        stream=True) if c.choices)
    served_chat = records(serve_sink)[-1]
    first, second = records(proxy_sink)[before:]
    assert first.output == reply.choices[0].text == served.output and first.slice == "code"
    assert (first.drafted_tokens, first.accepted_tokens) == (served.drafted_tokens, served.accepted_tokens)
    assert first.verify_steps == len([s for s in served.steps if s.k]) and first.source.startswith("proxy:127.0.0.1")
    assert first.prompt == served.prompt and first.steps == []
    # the chat prompt rendered with the target's template is the prompt the server fed its model
    assert second.prompt == served_chat.prompt and second.output == streamed == served_chat.output
    assert (second.drafted_tokens, second.accepted_tokens) == (served_chat.drafted_tokens, served_chat.accepted_tokens)
