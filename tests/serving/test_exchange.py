"""An OpenAI exchange another server answered -> one acceptance record, on responses in vLLM's shape."""

from __future__ import annotations

import json

import pytest

from draftwheel.serving.engine.records import ModelId, parse_record
from draftwheel.serving.server.exchange import ExchangeError, record_from_exchange, request_slice
from draftwheel.serving.testing import build_tokenizer
from tests.serving import vllm_fixtures as vllm

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]


@pytest.fixture(scope="module")
def tokenizer():
    return build_tokenizer()


def test_a_completion_with_vllms_figures(tmp_path):
    request = {"model": vllm.MODEL, "prompt": "alpha beta", "max_tokens": 53, "temperature": 0.0, "top_k": -1,
               "seed": 3, "metadata": {"slice": "code"}}
    draft = ModelId("draftwheel-draft", "4", "ab" * 32)
    record = record_from_exchange(request, vllm.completion(), source="vllm", draft_id=draft)
    assert record.source == "vllm" and record.mode == "draft" and record.draft_id == draft
    assert (record.drafted_tokens, record.accepted_tokens, record.verify_steps) == (129, 10, 43)
    assert record.mean_accepted_length == pytest.approx(vllm.SPEC["mean_acceptance_length"])
    assert record.acceptance_rate == pytest.approx(vllm.SPEC["draft_acceptance_rate"])
    assert record.steps == [] and record.prompt_token_ids == [] and record.output_token_ids == []
    assert (record.prompt, record.output, record.finish_reason) == ("alpha beta", "alpha beta gamma", "length")
    assert record.slice == "code" and record.ts == vllm.CREATED and record.target_id.name == vllm.MODEL
    assert (record.sampling.temperature, record.sampling.top_k, record.sampling.seed) == (0.0, 0, 3)
    line = record.to_json()
    assert parse_record(line) == record  # a valid log line, read back as written
    assert json.loads(line)["source"] == "vllm"


def test_a_streamed_chat_is_folded_and_its_prompt_rendered_with_the_chat_template(tokenizer):
    request = {"model": vllm.MODEL, "messages": MESSAGES, "stream": True}
    record = record_from_exchange(request, vllm.chat_chunks(), source="proxy:gpu:8000", tokenizer=tokenizer,
                                  header_slice="chat", ts=5.0, ttft_s=0.1, latency_s=0.4)
    assert record.output == "Hello there!" and record.finish_reason == "stop"
    assert record.prompt == tokenizer.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        add_generation_prompt=True, tokenize=False)
    assert (record.drafted_tokens, record.verify_steps, record.slice, record.ts) == (129, 43, "chat", 5.0)
    assert record.sampling.temperature == 1.0  # OpenAI's default when the request names none
    # the same stream as SSE text, as a log of raw events keeps it
    raw = [f"data: {json.dumps(chunk)}" for chunk in vllm.chat_chunks()] + ["data: [DONE]"]
    again = record_from_exchange(request, raw, source="x", tokenizer=tokenizer)
    assert (again.output, again.accepted_tokens) == (record.output, record.accepted_tokens)


def test_without_figures_the_record_keeps_the_text_and_claims_no_drafting():
    request = {"model": vllm.MODEL, "prompt": ["one prompt"], "stream": True}
    record = record_from_exchange(request, vllm.completion_chunks(usage=False), source="vllm",
                                  draft_id=ModelId("d"))
    assert record.mode == "autoregressive" and record.draft_id is None
    assert (record.drafted_tokens, record.verify_steps, record.output) == (0, 0, "alpha beta")


def test_token_ids_are_kept_when_the_server_returned_them():
    body = vllm.completion()
    body["choices"][0]["token_ids"] = [5, 6, 7]
    body["choices"][0]["prompt_token_ids"] = [1, 2]
    record = record_from_exchange({"model": "m", "prompt": "p"}, body, source="vllm")
    assert (record.prompt_token_ids, record.output_token_ids) == ([1, 2], [5, 6, 7])


def test_the_slice_as_draftwheel_serve_reads_it_then_the_header():
    assert request_slice({"slice": "sql", "metadata": {"slice": "x"}}, "h") == "sql"
    assert request_slice({"metadata": {"slice": "tools"}}, "h") == "tools"
    assert request_slice({"metadata": None}, "from-header") == "from-header"
    assert request_slice({}) == "default"


@pytest.mark.parametrize("request_body, response, kind", [
    ({"model": "m", "prompt": "p", "n": 2}, vllm.completion(), "not_single_sequence"),
    ({"model": "m", "prompt": ["a", "b"]}, vllm.completion(), "not_single_sequence"),
    ({"model": "m", "prompt": "p"}, {**vllm.completion(), "choices": vllm.completion()["choices"] * 2},
     "not_single_sequence"),
    ({"model": "m", "messages": MESSAGES}, vllm.chat(), "no_chat_template"),
    ({"model": "m", "prompt": "p"}, {"error": {"message": "bad model"}}, "upstream_error"),
    ({"model": "m", "prompt": "p"}, vllm.completion_chunks()[:1] + [{"error": {"message": "boom"}}], "upstream_error"),
    ({"model": "m", "prompt": "p"}, {**vllm.completion(), "metrics": {"speculative_decoding": {"num_spec_steps": 1}}},
     "bad_metrics"),
    ({"model": "m", "prompt": "p"}, ["data: {not json"], "not_an_object"),
    ({"model": "m", "prompt": "p"}, [], "missing_field"),
    ({"model": "m", "prompt": "p", "temperature": "hot"}, vllm.completion(), "wrong_type"),
    ({"model": "m"}, vllm.completion(), "missing_field"),
    ("not a request", vllm.completion(), "not_an_object"),
    ({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, vllm.chat(), "wrong_type"),
])
def test_exchanges_that_give_no_record_say_why(request_body, response, kind, tokenizer):
    with pytest.raises(ExchangeError) as info:
        uses_template = kind != "no_chat_template"
        record_from_exchange(request_body, response, source="vllm", tokenizer=tokenizer if uses_template else None)
    assert info.value.kind == kind
