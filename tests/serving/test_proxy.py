"""`draftwheel proxy` in front of a stand-in vLLM that answers with responses in vLLM's documented shape.

The upstream is an `httpx.MockTransport`: it records what the proxy asked and answers with the fixtures of
`tests.serving.vllm_fixtures` (a streamed response carries the figures on the usage chunk only when asked
for it, as vLLM does). The client talks to the proxy app through Starlette's TestClient. Each test checks
what the client got (byte for byte what the upstream sent, less a usage chunk it did not ask for) and the
record the proxy wrote.
"""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient

from draftwheel.serving.engine.records import ModelId
from draftwheel.serving.engine.sink import JsonlSink, iter_lines
from draftwheel.serving.engine.records import parse_record
from draftwheel.serving.server.proxy import ProxyConfig, create_proxy_app
from draftwheel.serving.testing import build_tokenizer
from tests.serving import vllm_fixtures as vllm

UPSTREAM = "http://vllm.test:8000/v1"


class FakeVllm:
    """Answers like vLLM started with --per-request-spec-decode-metrics summary; keeps the requests it got."""

    def __init__(self):
        self.seen: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(request)
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": vllm.MODEL, "object": "model"}]})
        body = json.loads(request.content)
        if body["model"] != vllm.MODEL:
            return httpx.Response(404, json={"error": {"message": f"The model `{body['model']}` does not exist.",
                                                       "type": "NotFoundError", "code": 404}})
        chat = request.url.path.endswith("/chat/completions")
        if not body.get("stream"):
            return httpx.Response(200, json=vllm.chat() if chat else vllm.completion())
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        chunks = vllm.chat_chunks(usage=usage) if chat else vllm.completion_chunks(usage=usage)
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=vllm.sse(chunks))


@pytest.fixture
def proxy(tmp_path):
    """(client, fake upstream, sink) of a proxy with the tiny tokenizer (its chat template) and a known draft."""
    upstream = FakeVllm()
    sink = JsonlSink(tmp_path / "logs", flush_every=1)
    app = create_proxy_app(ProxyConfig(upstream=UPSTREAM), sink, build_tokenizer(), ModelId("draft", "2", "cd" * 32),
                           transport=httpx.MockTransport(upstream))
    with TestClient(app) as client:
        yield client, upstream, sink
    sink.close()


def records(sink):
    return [parse_record(line) for _, _, line in iter_lines(sink.log_dir)]


def test_a_completion_passes_unchanged_and_is_recorded_with_vllms_figures(proxy):
    client, upstream, sink = proxy
    body = {"model": vllm.MODEL, "prompt": "alpha", "max_tokens": 53, "slice": "code"}
    response = client.post("/v1/completions", json=body, headers={"Authorization": "Bearer k"})
    assert response.status_code == 200 and response.json() == vllm.completion()  # metrics included, unchanged
    assert json.loads(upstream.seen[0].content) == body  # nothing added to a non-streamed request
    assert upstream.seen[0].headers["authorization"] == "Bearer k"
    (record,) = records(sink)
    assert record.source == "proxy:vllm.test:8000" and record.mode == "draft" and record.slice == "code"
    assert (record.drafted_tokens, record.accepted_tokens, record.verify_steps) == (129, 10, 43)
    assert record.draft_id == ModelId("draft", "2", "cd" * 32)
    assert (record.prompt, record.output) == ("alpha", "alpha beta gamma")


def test_a_stream_asks_for_the_usage_chunk_and_keeps_it_from_a_client_that_did_not(proxy):
    client, upstream, sink = proxy
    body = {"model": vllm.MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    with client.stream("POST", "/v1/chat/completions", json=body, headers={"X-Draftwheel-Slice": "chat"}) as response:
        received = b"".join(response.iter_bytes())
    assert json.loads(upstream.seen[0].content)["stream_options"] == {"include_usage": True}
    assert received == vllm.sse(vllm.chat_chunks(usage=False))  # what vLLM sends this client, byte for byte
    (record,) = records(sink)
    assert record.output == "Hello there!" and record.slice == "chat" and record.accepted_tokens == 10
    assert record.prompt.startswith("<|im_start|>user\nHi") and record.latency_s > 0


def test_a_client_that_asked_for_usage_gets_the_figures_too(proxy):
    client, upstream, sink = proxy
    body = {"model": vllm.MODEL, "prompt": "alpha", "stream": True, "stream_options": {"include_usage": True}}
    with client.stream("POST", "/v1/completions", json=body) as response:
        received = b"".join(response.iter_bytes())
    assert received == vllm.sse(vllm.completion_chunks(usage=True))
    assert records(sink)[0].verify_steps == 43


def test_what_gives_no_record_is_forwarded_and_counted(proxy, tmp_path):
    client, upstream, sink = proxy
    refused = client.post("/v1/completions", json={"model": "other", "prompt": "x"})
    assert refused.status_code == 404 and "does not exist" in refused.json()["error"]["message"]
    several = client.post("/v1/completions", json={"model": vllm.MODEL, "prompt": "x", "n": 2})
    assert several.status_code == 200  # forwarded all the same
    assert client.get("/v1/models").json()["data"][0]["id"] == vllm.MODEL
    health = client.get("/healthz").json()
    assert health["recorded"] == 0 and records(sink) == []
    assert health["not_recorded"] == {"upstream_error": 1, "not_single_sequence": 1}
    # a proxy without a tokenizer cannot render chat prompts: forwarded, not recorded
    bare_sink = JsonlSink(tmp_path / "bare")
    bare = create_proxy_app(ProxyConfig(upstream=UPSTREAM), bare_sink, None, transport=httpx.MockTransport(upstream))
    with TestClient(bare) as bare_client:
        chat = bare_client.post("/v1/chat/completions", json={"model": vllm.MODEL, "messages": [
            {"role": "user", "content": "Hi"}]})
        assert chat.json() == vllm.chat()
        assert bare_client.get("/healthz").json()["not_recorded"] == {"no_chat_template": 1}
    bare_sink.close()


def test_a_stream_the_upstream_cuts_is_not_recorded(tmp_path):
    class Cut(httpx.AsyncByteStream):
        async def __aiter__(self):
            yield vllm.sse(vllm.chat_chunks())[:200]
            raise httpx.ReadError("connection reset by peer")

    def cut(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=Cut())

    sink = JsonlSink(tmp_path / "logs")
    app = create_proxy_app(ProxyConfig(upstream=UPSTREAM), sink, build_tokenizer(), transport=httpx.MockTransport(cut))
    with TestClient(app, raise_server_exceptions=False) as client:
        with client.stream("POST", "/v1/chat/completions", json={
                "model": vllm.MODEL, "messages": [{"role": "user", "content": "Hi"}], "stream": True}) as response:
            received = b"".join(response.iter_bytes())
        health = client.get("/healthz").json()
    sink.close()
    assert b"[DONE]" not in received and vllm.sse(vllm.chat_chunks()).startswith(received)  # cut short, as upstream
    assert health["recorded"] == 0 and health["not_recorded"] == {"stream_cut": 1}
    assert records(sink) == []


def test_an_unreachable_upstream_is_a_502_with_an_openai_error_body(tmp_path):
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    sink = JsonlSink(tmp_path / "logs")
    app = create_proxy_app(ProxyConfig(upstream=UPSTREAM), sink, transport=httpx.MockTransport(refuse))
    with TestClient(app) as client:
        response = client.post("/v1/completions", json={"model": vllm.MODEL, "prompt": "x"})
    sink.close()
    assert response.status_code == 502
    assert "unreachable" in response.json()["error"]["message"]


@pytest.mark.parametrize("upstream, message", [("vllm.test:8000", "upstream"), ("ftp://x", "upstream")])
def test_a_bad_upstream_url_is_refused_naming_it(upstream, message):
    with pytest.raises(ValueError, match=message):
        ProxyConfig(upstream=upstream)
    assert ProxyConfig(upstream="http://h:1/v1/").base_url == "http://h:1"
