"""The wire format's request checks, without a server: JSON types are taken as sent (no "yes" -> true),
and text that is not valid Unicode (a lone surrogate, which JSON's \\uD800 escape can carry) is refused
naming the field. The HTTP status and body these become are checked in test_server_limits.py."""

from __future__ import annotations

import pydantic
import pytest

from draftwheel.serving.server.openai_api import ApiError, ChatRequest, CompletionRequest, check_text

BASE = {"model": "m", "prompt": "hi"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize(("cls", "body", "field"), [
    (CompletionRequest, {**BASE, "stream": "yes"}, "stream"),
    (CompletionRequest, {**BASE, "stream": 1}, "stream"),
    (CompletionRequest, {**BASE, "echo": "false"}, "echo"),
    (CompletionRequest, {**BASE, "max_tokens": "2"}, "max_tokens"),
    (CompletionRequest, {**BASE, "max_tokens": 2.5}, "max_tokens"),
    (CompletionRequest, {**BASE, "max_tokens": True}, "max_tokens"),
    (CompletionRequest, {**BASE, "temperature": "0"}, "temperature"),
    (CompletionRequest, {**BASE, "top_p": False}, "top_p"),
    (CompletionRequest, {**BASE, "seed": "7"}, "seed"),
    (CompletionRequest, {**BASE, "n": True}, "n"),
    (CompletionRequest, {**BASE, "k": "4"}, "k"),
    (CompletionRequest, {**BASE, "stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
    (CompletionRequest, {**BASE, "stream": True, "stream_options": {"include_usag": True}}, "include_usag"),
    (ChatRequest, {**CHAT, "logprobs": "no"}, "logprobs"),
    (ChatRequest, {**CHAT, "max_completion_tokens": "9"}, "max_completion_tokens"),
])
def test_fields_take_json_types_as_sent(cls, body, field):
    with pytest.raises(pydantic.ValidationError, match=field):
        cls.model_validate(body)


def test_json_numbers_still_fit_float_fields():
    request = CompletionRequest.model_validate({**BASE, "temperature": 0, "top_p": 1, "stream": False})
    assert (request.temperature, request.top_p, request.stream) == (0.0, 1.0, False)
    assert CompletionRequest.model_validate({**BASE, "stream_options": {"include_usage": True}}).include_usage


@pytest.mark.parametrize(("cls", "body", "field"), [
    (CompletionRequest, {**BASE, "prompt": "a\ud800b"}, "prompt"),
    (CompletionRequest, {**BASE, "prompt": ["fine", "\udfff"]}, "prompt.1"),
    (CompletionRequest, {**BASE, "stop": ["\ud800"]}, "stop.0"),
    (CompletionRequest, {**BASE, "metadata": {"slice": "\ud800"}}, "metadata.slice"),
    (CompletionRequest, {**BASE, "metadata": {"\ud800": "x"}}, "metadata"),
    (ChatRequest, {**CHAT, "messages": [{"role": "user", "content": "\ud800"}]}, "messages.0.content"),
    (ChatRequest, {**CHAT, "messages": [{"role": "user", "content": "ok"},
                                        {"role": "user", "content": [{"type": "text", "text": "x\ud83d"}]}]},
     "messages.1.content.0.text"),
])
def test_lone_surrogates_are_refused_naming_the_field(cls, body, field):
    with pytest.raises(ApiError) as caught:
        check_text(cls.model_validate(body))
    error = caught.value
    assert error.status == 400 and error.param == field
    assert error.message.startswith(f"{field}: ") and "lone surrogate" in error.message
    error.message.encode("utf-8")  # the message itself is sendable


def test_valid_unicode_passes_the_text_check():
    check_text(CompletionRequest.model_validate({**BASE, "prompt": "caf\u00e9 \U0001f600 \u4e2d"}))
