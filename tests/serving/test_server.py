"""The HTTP server with the official `openai` client, against the real Engine on tiny models.

A uvicorn server runs in a background thread on a free 127.0.0.1 port (`background_server`). The draft is the target with
noise on its output head, so speculative steps both accept and roll back. Greedy HTTP output is checked
against HF `generate(do_sample=False)` of the target through the acceptance record the request wrote.
"""

from __future__ import annotations

import copy
import json
import threading

import httpx
import openai
import pytest
import torch
from prometheus_client.parser import text_string_to_metric_families

from draftwheel.serving.engine.engine import Engine

from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.server.metrics import Metrics
from draftwheel.serving.engine.models import weights_sha256
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.records import parse_record
from draftwheel.serving.server.app import ServeConfig, background_server, create_app
from draftwheel.serving.engine.sink import JsonlSink, iter_lines
from draftwheel.serving.testing import build_tokenizer, save_model, tiny_llama

PROMPTS = ["The quick brown", "def add(a, b):", "Please write a short", "import os\n"]


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=1, tie_embeddings=False)  # no early EOS on PROMPTS
    draft = copy.deepcopy(target)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a noisy head: the draft agrees with the target often, not always
        draft.lm_head.weight.add_(torch.randn(draft.lm_head.weight.shape, generator=generator) * 0.3
                                  * draft.lm_head.weight.std())
    return save_model(target, tokenizer, root / "target"), save_model(draft, tokenizer, root / "draft")


@pytest.fixture(scope="module")
def stack(model_dirs, tmp_path_factory):
    """(engine, sink, base_url) of a running server without an API key, one request at a time (the batched
    server, the default: tests/serving/test_server_batching.py)."""
    log_dir = tmp_path_factory.mktemp("logs")
    metrics = Metrics()
    sink = JsonlSink(log_dir, flush_every=4, metrics=metrics)
    engine = engine_from_specs(*model_dirs, sink=sink, metrics=metrics)
    with background_server(create_app(engine, ServeConfig(served_model_name="tiny", scheduler="serial"))) as url:
        yield engine, sink, url
    sink.close()


@pytest.fixture(scope="module")
def client(stack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack[2] + "/v1", api_key="unused", max_retries=0, timeout=60)


def last_record(sink: JsonlSink):
    *_, (_, _, line) = iter_lines(sink.log_dir)
    return parse_record(line)


def hf_greedy(engine: Engine, prompt_ids: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt_ids])
    out = engine.target.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=n)
    return out[0, ids.shape[1]:].tolist()


def test_models_and_healthz_report_the_served_pair(stack, client, model_dirs):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").owned_by == "draftwheel"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4")
    health = httpx.get(stack[2] + "/healthz").json()
    assert health["status"] == "ok" and health["mode"] == "draft" and health["model"] == "tiny"
    assert health["target"]["name"] == "target" and health["target"]["sha256"] == weights_sha256(model_dirs[0])
    assert health["draft"]["name"] == "draft" and health["draft"]["sha256"] == weights_sha256(model_dirs[1])


def test_greedy_completion_equals_hf_generate_and_streams_the_same_text(stack, client):
    engine, sink, _ = stack
    for prompt in PROMPTS[:2]:
        response = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0)
        record = last_record(sink)
        assert record.output == response.choices[0].text and record.mode == "draft"
        assert record.output_token_ids == hf_greedy(engine, record.prompt_token_ids, 24)
        assert response.usage.completion_tokens == 24 and response.choices[0].finish_reason == "length"
        chunks = list(client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0,
                                                stream=True))
        texts = [c.choices[0].text for c in chunks]
        assert len([t for t in texts if t]) > 1, "not actually streamed"
        assert "".join(texts) == response.choices[0].text
        assert chunks[-1].choices[0].finish_reason == "length"


def test_chat_completion_uses_the_chat_template_and_streams_the_same_text(stack, client):
    engine, sink, _ = stack
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello! How can"}]
    response = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0)
    record = last_record(sink)
    expected_prompt = engine.target.tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                                  tokenize=False)
    assert record.prompt == expected_prompt and record.prompt.endswith("<|im_start|>assistant\n")
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == record.output
    assert record.output_token_ids == hf_greedy(engine, record.prompt_token_ids, 16)
    stream = client.chat.completions.create(model="tiny", messages=messages, max_tokens=16, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == record.output
    assert chunks[-1].usage.completion_tokens == 16 and chunks[-1].usage.prompt_tokens == len(record.prompt_token_ids)


def test_stop_string_text_is_identical_streamed_and_not(client):
    full = client.completions.create(model="tiny", prompt="import os\n", max_tokens=24, temperature=0)
    text = full.choices[0].text
    stop = text[len(text) // 2: len(text) // 2 + 2]
    cut = client.completions.create(model="tiny", prompt="import os\n", max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == text[: text.index(stop)]
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="import os\n", max_tokens=24, temperature=0, stop=[stop], stream=True))
    assert streamed == cut.choices[0].text


def test_seeded_sampling_is_reproducible_across_stream_and_not(client, stack):
    kwargs = dict(model="tiny", prompt="The quick brown", max_tokens=16, temperature=1.0, top_p=0.9, seed=123)
    first = client.completions.create(**kwargs).choices[0].text
    assert last_record(stack[1]).sampling.seed == 123
    assert client.completions.create(**kwargs).choices[0].text == first
    assert "".join(c.choices[0].text for c in client.completions.create(stream=True, **kwargs)) == first


def test_slice_from_extra_body_or_metadata_reaches_the_record(client, stack):
    client.completions.create(model="tiny", prompt="Hi", max_tokens=2, extra_body={"slice": "code"})
    assert last_record(stack[1]).slice == "code"
    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}], max_tokens=2,
                                   metadata={"slice": "chat"})
    assert last_record(stack[1]).slice == "chat"
    client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
    assert last_record(stack[1]).slice == "default"


def test_batched_prompts_get_one_choice_each(client):
    response = client.completions.create(model="tiny", prompt=PROMPTS[:3], max_tokens=8, temperature=0)
    singles = [client.completions.create(model="tiny", prompt=p, max_tokens=8, temperature=0).choices[0].text
               for p in PROMPTS[:3]]
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert [c.text for c in response.choices] == singles
    assert response.usage.completion_tokens == 24


def test_concurrent_requests_are_queued_not_dropped(client, stack):
    expected = {p: client.completions.create(model="tiny", prompt=p, max_tokens=20, temperature=0).choices[0].text
                for p in PROMPTS}
    results: dict[str, str] = {}
    errors: list[BaseException] = []

    def call(prompt: str, stream: bool) -> None:
        try:
            if stream:
                results[prompt] = "".join(c.choices[0].text for c in client.completions.create(
                    model="tiny", prompt=prompt, max_tokens=20, temperature=0, stream=True))
            else:
                results[prompt] = client.completions.create(model="tiny", prompt=prompt, max_tokens=20,
                                                            temperature=0).choices[0].text
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(p, i % 2 == 1)) for i, p in enumerate(PROMPTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and results == expected
    assert httpx.get(stack[2] + "/healthz").json()["queue_depth"] == 0
    # One at a time: the four requests' [start, end] intervals in their records do not overlap.
    records = sorted((parse_record(line) for *_, line in iter_lines(stack[1].log_dir)), key=lambda r: r.ts)[-4:]
    assert sorted(r.prompt for r in records) == sorted(PROMPTS)
    for earlier, later in zip(records, records[1:]):
        assert earlier.ts + earlier.latency_s <= later.ts + 0.005


def test_a_client_that_disconnects_mid_stream_frees_the_engine(client, stack):
    body = {"model": "tiny", "prompt": "cancel me", "max_tokens": 1000, "temperature": 0, "stream": True}
    with httpx.stream("POST", stack[2] + "/v1/completions", json=body) as response:
        next(response.iter_lines())  # the first event, then hang up
    after = client.completions.create(model="tiny", prompt="Hi", max_tokens=2)
    assert after.usage.completion_tokens == 2
    # Had the abandoned request run on, its record (1000 tokens) would precede this one in the log.
    prompts = [parse_record(line).prompt for *_, line in iter_lines(stack[1].log_dir)]
    assert prompts[-1] == "Hi" and "cancel me" not in prompts


def _metric(url: str, name: str) -> float:
    """The sum of the samples named `name` (the speculative counters have one per `source` label)."""
    families = text_string_to_metric_families(httpx.get(url + "/metrics").text)
    return sum(sample.value for family in families for sample in family.samples if sample.name == name)


def test_metrics_endpoint_counters_move_after_a_request(client, stack):
    url = stack[2]
    names = ["draftwheel_spec_drafts_total", "draftwheel_spec_draft_tokens_total",
             "draftwheel_generated_tokens_total", "draftwheel_request_latency_seconds_count",
             "draftwheel_spec_rollback_depth_count"]
    before = {n: _metric(url, n) for n in names}
    client.completions.create(model="tiny", prompt="The quick brown", max_tokens=12, temperature=0)
    record = last_record(stack[1])
    after = {n: _metric(url, n) for n in names}
    assert after["draftwheel_generated_tokens_total"] - before["draftwheel_generated_tokens_total"] == 12
    assert after["draftwheel_spec_drafts_total"] - before["draftwheel_spec_drafts_total"] == record.verify_steps > 0
    assert after["draftwheel_spec_draft_tokens_total"] - before["draftwheel_spec_draft_tokens_total"] \
        == record.drafted_tokens
    assert after["draftwheel_request_latency_seconds_count"] - before["draftwheel_request_latency_seconds_count"] == 1
    assert after["draftwheel_spec_rollback_depth_count"] - before["draftwheel_spec_rollback_depth_count"] \
        == record.verify_steps


LONG = "The quick brown fox jumps over the lazy dog. " * 200  # well over the 1024-position context


@pytest.mark.parametrize(("path", "body", "status", "needle"), [
    ("/v1/completions", {"model": "gpt-4", "prompt": "hi"}, 404, "model: 'gpt-4' is not served"),
    ("/v1/completions", {"model": "tiny", "prompt": LONG, "max_tokens": 4}, 400, "context is 1024 tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": LONG, "stream": True}, 400, "context is 1024 tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 1023}, 400, "exceeds the model's context"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": -1}, 400, "max_tokens: must be >= 1"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": "many"}, 400, "max_tokens"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "temperature": -0.5}, 400, "temperature: must be >= 0"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "top_p": 0}, 400, "top_p: must be in (0, 1]"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "top_p": 1.5}, 400, "top_p: must be in (0, 1]"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "top_k": -3}, 400, "top_k"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "k": 0}, 400, "k: must be"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "n": 2}, 400, "n: only n=1 is supported"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "logprobs": 3}, 400, "logprobs"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "presence_penalty": 1}, 400, "presence_penalty"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "stop": [""]}, 400, "stop"),
    ("/v1/completions", {"model": "tiny", "prompt": ["a", "b"], "stream": True}, 400, "single prompt"),
    ("/v1/completions", {"model": "tiny", "prompt": ""}, 400, "empty"),
    ("/v1/completions", {"model": "tiny"}, 400, "prompt: Field required"),
    ("/v1/completions", {"prompt": "hi"}, 400, "model: Field required"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "bogus": 1}, 400, "bogus: Extra inputs"),
    ("/v1/completions", [1, 2], 400, "request"),
    ("/v1/completions", {"model": "tiny", "prompt": [1, 2, 3]}, 400, "prompt: Input should be a valid string"),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "seed": 2**70}, 400, "seed: must fit in 64 bits"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": "x"}]}]}, 400, "messages.0.content"),
    ("/v1/chat/completions", {"model": "tiny", "messages": []}, 400, "messages"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": LONG}]}, 400,
     "context is 1024 tokens"),
    ("/v1/chat/completions", {"model": "tiny", "messages": [{"role": "user", "content": "x"}],
                              "max_completion_tokens": 0}, 400, "max_tokens: must be >= 1"),
])
def test_bad_input_gets_a_4xx_with_a_clear_message(stack, path, body, status, needle):
    response = httpx.post(stack[2] + path, json=body, timeout=60)
    assert response.status_code == status, response.text
    assert needle in response.json()["error"]["message"], response.text


def test_malformed_json_and_unknown_routes_are_4xx(stack):
    url = stack[2]
    response = httpx.post(url + "/v1/completions", content=b'{"model": "tiny", "prompt": ',
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and "malformed JSON" in response.json()["error"]["message"]
    assert httpx.post(url + "/v1/completions", content=b"").status_code == 400
    assert httpx.get(url + "/v1/nothing").status_code == 404
    assert httpx.get(url + "/v1/completions").status_code == 405


def test_openai_client_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="hi")
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], temperature=-1)
    # the server survived all of the above
    assert client.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens == 2


def test_api_key_is_required_when_configured(stack):
    engine = stack[0]
    with background_server(create_app(engine, ServeConfig(served_model_name="tiny", api_key="s3cret"))) as url:
        wrong = openai.OpenAI(base_url=url + "/v1", api_key="nope", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.completions.create(model="tiny", prompt="hi", max_tokens=2)
        assert httpx.get(url + "/v1/models").status_code == 401
        assert httpx.post(url + "/v1/completions", content=b"{bad").status_code == 401  # auth before parsing
        right = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0)
        assert right.completions.create(model="tiny", prompt="hi", max_tokens=2).usage.completion_tokens == 2
        assert httpx.get(url + "/healthz").status_code == 200  # probes and scrapers need no key
        assert httpx.get(url + "/metrics").status_code == 200


def test_sse_wire_format(stack):
    body = {"model": "tiny", "prompt": "hi", "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", stack[2] + "/v1/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        raw = response.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert all(p["object"] == "text_completion" for p in payloads)


def test_engine_without_metrics_gets_one_for_the_endpoint(model_dirs):
    engine = engine_from_specs(model_dirs[0])  # no draft, no sink, no metrics
    with background_server(create_app(engine, ServeConfig(served_model_name="plain", default_temperature=0.0))) as url:
        health = httpx.get(url + "/healthz").json()
        assert health["mode"] == "autoregressive" and health["draft"] is None
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        text = client.completions.create(model="plain", prompt="def add(a, b):", max_tokens=6).choices[0].text
        assert _metric(url, "draftwheel_generated_tokens_total") == 6
        assert _metric(url, "draftwheel_spec_drafts_total") == 0
        assert text == engine.generate(["def add(a, b):"], SamplingParams(max_new_tokens=6))[0].text


def test_reference_target_chat_over_http_matches_hf_generate(reference_target):
    """SmolLM2-135M-Instruct (the session's conversion of the shipped GGUF) with its own chat template, a
    draft made of its first 2 layers: the greedy chat completion over HTTP equals HF generate on the
    templated prompt."""
    from draftwheel.serving.engine.models import from_objects
    from draftwheel.serving.loading import load_model

    target = load_model(reference_target)
    draft = copy.deepcopy(target.model)
    draft.model.layers = draft.model.layers[:2]
    draft.config.num_hidden_layers = 2
    engine = Engine(target, from_objects(draft, target.tokenizer, "first-2-layers"), metrics=Metrics())
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    with background_server(create_app(engine, ServeConfig())) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)
        response = client.chat.completions.create(model="smollm2-135m-instruct", messages=messages,
                                                  max_tokens=24, temperature=0)
    prompt_ids = target.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                      return_dict=True)["input_ids"]
    expected = hf_greedy(engine, list(prompt_ids), 24)
    eos = target.tokenizer.eos_token_id
    expected_text = target.tokenizer.decode([t for t in expected if t != eos], skip_special_tokens=True)
    assert response.choices[0].message.content == expected_text
    assert "Paris" in expected_text
    assert response.usage.completion_tokens == len(expected)
