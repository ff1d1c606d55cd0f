"""The OpenAI-compatible wire format: request models, their validation, and response/chunk bodies.

Request bodies are pydantic models that reject unknown fields; `to_sampling_params` turns one into the
engine's `SamplingParams`, raising `ApiError` (an HTTP status + OpenAI-style error body) with the
OpenAI field name for bad values and for features the engine does not support (n > 1, logprobs,
penalties, ...). Fields take JSON types as sent (strict: `"stream": "yes"` or `"max_tokens": "2"` is a
400, not a guess), and `check_text` refuses text that is not valid Unicode (a lone surrogate such as
`"\\ud800"`, which JSON can carry but no tokenizer or log line can encode), naming the field.
draftwheel extensions, sent by the `openai` client through `extra_body`: `slice` (the record's
workload label; `metadata.slice` works too), `top_k`, `k` (draft length) and `mode` (decoding mode,
e.g. `hybrid`; an unknown or unservable mode is a 400).

No I/O and no engine calls here; routing, queueing and SSE framing live in `draftwheel.serving.server.app`.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from draftwheel.serving.engine.params import SamplingParams


class ApiError(Exception):
    """A request that gets a 4xx: `status`, a message for humans, the offending `param` if any."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


_STRICT = ConfigDict(extra="forbid", strict=True)  # unknown fields and type coercion are both refused


class StreamOptions(BaseModel):
    model_config = _STRICT
    include_usage: bool = False


class _Request(BaseModel):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model_config = _STRICT

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    user: str | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    metadata: dict[str, str] | None = None
    # draftwheel extensions
    slice: str | None = None
    top_k: int | None = None
    k: int | None = None
    mode: str | None = None  # decoding mode (draftwheel.serving.engine.records.MODES); None = the server's choice

    def unsupported(self) -> list[tuple[str, str]]:
        """(field, why) for every feature that was asked for but is not served."""
        problems = []
        if self.n != 1:
            problems.append(("n", f"only n=1 is supported, got {self.n}"))
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name):
                problems.append((name, "penalties are not supported (would change the target distribution)"))
        if self.logit_bias:
            problems.append(("logit_bias", "logit_bias is not supported"))
        return problems

    @property
    def record_slice(self) -> str:
        return self.slice or (self.metadata or {}).get("slice") or "default"

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Request):
    prompt: str | list[str]
    echo: bool = False
    logprobs: int | None = None
    best_of: int | None = None
    suffix: str | None = None

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if self.echo:
            problems.append(("echo", "echo is not supported"))
        if self.logprobs is not None:
            problems.append(("logprobs", "logprobs are not supported"))
        if self.best_of not in (None, 1):
            problems.append(("best_of", f"only best_of=1 is supported, got {self.best_of}"))
        if self.suffix:
            problems.append(("suffix", "suffix is not supported"))
        return problems

    def prompts(self) -> list[str]:
        prompts = [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)
        if not prompts:
            raise ApiError(400, "prompt: must not be an empty list", "prompt")
        if self.stream and len(prompts) > 1:
            raise ApiError(400, "prompt: streaming supports a single prompt", "prompt")
        return prompts


class TextPart(BaseModel):
    model_config = _STRICT
    type: Literal["text"]
    text: str


class ChatMessage(BaseModel):
    model_config = _STRICT
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_template_message(self) -> dict[str, str]:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": self.role, "content": content}


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False

    def unsupported(self) -> list[tuple[str, str]]:
        problems = super().unsupported()
        if self.logprobs:
            problems.append(("logprobs", "logprobs are not supported"))
        return problems


def check_supported(request: _Request) -> None:
    problems = request.unsupported()
    if problems:
        field, why = problems[0]
        raise ApiError(400, f"{field}: {why}", field)


def _lone_surrogate(value: Any, path: str) -> tuple[str, str] | None:
    """(field path, problem) for the first string (or mapping key) in `value` that UTF-8 cannot encode."""
    items: Any = ()
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return path, f"lone surrogate U+{ord(value[exc.start]):04X} at character {exc.start}"
    elif isinstance(value, dict):
        # a bad key is reported at the mapping's own path: the key itself cannot be printed
        items = [(path, key) for key in value] + [(f"{path}.{key}", v) for key, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = [(f"{path}.{i}", v) for i, v in enumerate(value)]
    return next((found for sub, v in items if (found := _lone_surrogate(v, sub)) is not None), None)


def check_text(request: _Request) -> None:
    """400 naming the field when any text in the request is not valid Unicode (checked before tokenising)."""
    found = _lone_surrogate(request.model_dump(exclude_defaults=True), "")
    if found is not None:
        field, problem = found[0].lstrip("."), found[1]
        raise ApiError(400, f"{field}: not valid Unicode text ({problem})", field)


def requested_max_tokens(request: _Request) -> int | None:
    value = request.max_tokens
    if isinstance(request, ChatRequest) and request.max_completion_tokens is not None:
        value = request.max_completion_tokens
    if value is not None and value < 1:
        raise ApiError(400, f"max_tokens: must be >= 1, got {value}", "max_tokens")
    return value


def to_sampling_params(request: _Request, max_tokens: int, defaults: SamplingParams,
                       default_temperature: float) -> SamplingParams:
    """Build the engine's params; errors name the OpenAI field."""
    temperature = default_temperature if request.temperature is None else request.temperature
    if temperature < 0:
        raise ApiError(400, f"temperature: must be >= 0, got {temperature}", "temperature")
    top_p = 1.0 if request.top_p is None else request.top_p
    if not 0.0 < top_p <= 1.0:
        raise ApiError(400, f"top_p: must be in (0, 1], got {top_p}", "top_p")
    if request.seed is not None and not -(2**63) <= request.seed < 2**64:  # torch.Generator's range
        raise ApiError(400, f"seed: must fit in 64 bits, got {request.seed}", "seed")
    stop = [request.stop] if isinstance(request.stop, str) else list(request.stop or [])
    fields = {"max_new_tokens": "max_tokens", "stop": "stop", "k": "k", "top_k": "top_k", "seed": "seed",
              "temperature": "temperature"}
    try:
        return SamplingParams(
            max_new_tokens=max_tokens, temperature=float(temperature), top_p=float(top_p),
            top_k=defaults.top_k if request.top_k is None else request.top_k, seed=request.seed,
            k=defaults.k if request.k is None else request.k, adaptive_k=defaults.adaptive_k, stop=stop,
        )
    except ValueError as exc:
        engine_field = str(exc).split(":", 1)[0]
        field = fields.get(engine_field, engine_field)
        raise ApiError(400, f"{field}:{str(exc).split(':', 1)[-1]}", field) from exc


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _with_metrics(body: dict[str, Any], metrics: dict[str, Any] | None) -> dict[str, Any]:
    """`body` with vLLM's per-request `metrics` object when there is one (None: the server sends none)."""
    return body if metrics is None else {**body, "metrics": metrics}


def completion_body(rid: str, model: str, choices: list[tuple[str, str]], prompt_tokens: int,
                    completion_tokens: int, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """A `text_completion`; `choices` are (text, finish_reason) in prompt order."""
    return _with_metrics({"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
                          "choices": [{"index": i, "text": text, "logprobs": None, "finish_reason": reason}
                                      for i, (text, reason) in enumerate(choices)],
                          "usage": usage(prompt_tokens, completion_tokens)}, metrics)


def chat_body(rid: str, model: str, text: str, finish_reason: str, prompt_tokens: int,
              completion_tokens: int, metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    return _with_metrics({"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
                          "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                       "logprobs": None, "finish_reason": finish_reason}],
                          "usage": usage(prompt_tokens, completion_tokens)}, metrics)


def completion_chunk(rid: str, model: str, text: str, finish_reason: str | None) -> dict[str, Any]:
    return {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}]}


def chat_chunk(rid: str, model: str, delta: dict[str, str], finish_reason: str | None) -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}]}


def usage_chunk(rid: str, model: str, chat: bool, prompt_tokens: int, completion_tokens: int,
                metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """The final chunk sent when `stream_options.include_usage` is set: no choices, only usage (and, as vLLM
    sends it there, the per-request `metrics`)."""
    kind = "chat.completion.chunk" if chat else "text_completion"
    return _with_metrics({"id": rid, "object": kind, "created": int(time.time()), "model": model, "choices": [],
                          "usage": usage(prompt_tokens, completion_tokens)}, metrics)
