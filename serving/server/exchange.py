"""One OpenAI exchange another server answered -> one acceptance record (`source` set, no steps).

`draftwheel proxy` (draftwheel.serving.server.proxy) and `draftwheel ingest` (draftwheel.mining.ingest)
see what vLLM, SGLang or draftwheel serve answered a `/v1/completions` or `/v1/chat/completions` request:
a response body, or the chunks of a streamed one (`fold_chunks`). `record_from_exchange` turns the pair
into the record this engine would have logged, as far as the wire tells:

- the prompt **as fed to the model**: a completion's `prompt`; a chat request's messages through the
  target's chat template (`tokenizer`; without one a chat exchange is refused: its text would not be
  what the model saw);
- the output text, the finish reason, the sampling settings the request named (OpenAI's defaults for
  the rest: temperature 1, top_p 1);
- token ids only when the server returned them (vLLM's `prompt_token_ids` / `token_ids`), else empty:
  mining tokenises the text with the target's tokenizer;
- the speculative totals of `metrics.speculative_decoding` (draftwheel.serving.server.spec_metrics):
  then mode `draft` and `drafted_tokens`, `accepted_tokens`, `verify_steps` as reported; without them
  mode `autoregressive` and zeros (nothing is known about drafting);
- the slice: `request_slice` (the request's `slice` or `metadata.slice`, as draftwheel serve reads it,
  else the `X-Draftwheel-Slice` header, else `default`).

Anything else (an error response, several choices, a malformed body) raises `ExchangeError` with a
`kind`, so callers count or quarantine it. Pure functions: no I/O, no HTTP.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from draftwheel.serving.engine.records import AcceptanceRecord, ModelId, RecordError, Sampling, check_record
from draftwheel.serving.server.spec_metrics import reported_counts

SLICE_HEADER = "x-draftwheel-slice"


class ExchangeError(ValueError):
    """An exchange that gives no record; `kind`: not_an_object, missing_field, wrong_type, upstream_error,
    not_single_sequence, no_chat_template, bad_metrics."""

    def __init__(self, reason: str, kind: str):
        super().__init__(reason)
        self.kind = kind


@dataclass
class Reply:
    """What a response (a body or its chunks) says about the one sequence it returned."""

    model: str = ""
    created: float | None = None
    text: str = ""
    finish_reason: str = ""
    metrics: Any = None
    prompt_token_ids: list[Any] = field(default_factory=list)
    token_ids: list[Any] = field(default_factory=list)


def _choice(body: dict[str, Any], where: str) -> dict[str, Any] | None:
    choices = body.get("choices")
    if not isinstance(choices, list):
        raise ExchangeError(f"{where}.choices: expected a list", "wrong_type")
    if any(not isinstance(c, dict) or c.get("index", 0) != 0 for c in choices):
        raise ExchangeError(f"{where}.choices: more than one sequence (n > 1 or several prompts)", "not_single_sequence")
    if len(choices) > 1:
        raise ExchangeError(f"{where}.choices: {len(choices)} choices, one expected", "not_single_sequence")
    return choices[0] if choices else None


def _check_error(body: Any, where: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise ExchangeError(f"{where}: expected a JSON object, got {type(body).__name__}", "not_an_object")
    if body.get("error") is not None:
        error = body["error"]
        message = error.get("message") if isinstance(error, dict) else error
        raise ExchangeError(f"{where}: the server answered an error: {message}", "upstream_error")
    return body


def _text_of(choice: dict[str, Any], key: str) -> str:
    part = choice.get(key)
    content = part.get("content") if isinstance(part, dict) else None
    text = choice.get("text") if key == "text" else content
    if text is not None and not isinstance(text, str):
        raise ExchangeError(f"choices[0].{key}: expected text", "wrong_type")
    return text or ""


def _fill(reply: Reply, body: dict[str, Any], choice: dict[str, Any] | None, key: str) -> None:
    """Add one body's (or chunk's) contribution to `reply`."""
    reply.model = body.get("model") or reply.model
    if isinstance(body.get("created"), (int, float)) and reply.created is None:
        reply.created = float(body["created"])
    if body.get("metrics") is not None:
        reply.metrics = body["metrics"]
    if isinstance(body.get("prompt_token_ids"), list):
        reply.prompt_token_ids = body["prompt_token_ids"]
    if choice is None:
        return
    reply.text += _text_of(choice, key)
    reply.finish_reason = choice.get("finish_reason") or reply.finish_reason
    if isinstance(choice.get("prompt_token_ids"), list):
        reply.prompt_token_ids = choice["prompt_token_ids"]
    if isinstance(choice.get("token_ids"), list):
        reply.token_ids = reply.token_ids + choice["token_ids"]


def read_body(body: Any, chat: bool) -> Reply:
    """The `Reply` of a non-streamed response body."""
    body = _check_error(body, "response")
    reply = Reply()
    choice = _choice(body, "response")
    if choice is None:
        raise ExchangeError("response.choices: empty", "missing_field")
    _fill(reply, body, choice, "message" if chat else "text")
    return reply


def parse_event(data: str | bytes) -> Any:
    """One SSE event's JSON payload (`data: {...}` lines joined); None for `[DONE]` or an event without data."""
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    payload = "\n".join(line[5:].lstrip() for line in text.splitlines() if line.startswith("data:"))
    if not payload or payload.strip() == "[DONE]":
        return None
    try:
        return json.loads(payload)
    except json.JSONDecodeError as exc:
        raise ExchangeError(f"stream: an event is not JSON ({exc.msg})", "not_an_object") from exc


def fold_chunks(chunks: list[Any], chat: bool) -> Reply:
    """The `Reply` of a streamed response: its chunks as objects, or as SSE text (`data: {...}`)."""
    reply = Reply()
    seen = False
    for index, chunk in enumerate(chunks):
        if isinstance(chunk, (str, bytes)):
            chunk = parse_event(chunk)
            if chunk is None:
                continue
        body = _check_error(chunk, f"response[{index}]")
        _fill(reply, body, _choice(body, f"response[{index}]"), "delta" if chat else "text")
        seen = True
    if not seen:
        raise ExchangeError("response: no chunks", "missing_field")
    return reply


def request_slice(request: dict[str, Any], header: str | None = None) -> str:
    """The workload label: the body's `slice`, else `metadata.slice` (as draftwheel serve reads them), else
    the `X-Draftwheel-Slice` header, else `default`."""
    metadata = request.get("metadata") if isinstance(request.get("metadata"), dict) else {}
    for value in (request.get("slice"), metadata.get("slice"), header):
        if isinstance(value, str) and value:
            return value
    return "default"


def _number(request: dict[str, Any], name: str, default: float) -> float:
    value = request.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ExchangeError(f"request.{name}: expected a number, got {value!r}", "wrong_type")
    return float(value)


def _sampling(request: dict[str, Any]) -> Sampling:
    top_k = request.get("top_k")
    seed = request.get("seed")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int)):
        raise ExchangeError(f"request.top_k: expected an integer, got {top_k!r}", "wrong_type")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ExchangeError(f"request.seed: expected an integer, got {seed!r}", "wrong_type")
    return Sampling(temperature=_number(request, "temperature", 1.0), top_p=_number(request, "top_p", 1.0),
                    top_k=max(top_k or 0, 0), seed=seed)  # vLLM's top_k -1 is OpenAI's "off", our 0


def _messages(request: dict[str, Any]) -> list[dict[str, str]]:
    messages = request.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ExchangeError("request.messages: expected a non-empty list", "wrong_type")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ExchangeError(f"request.messages[{i}]: expected {{role, content}}", "wrong_type")
        content = message.get("content") or ""
        if isinstance(content, list):
            if any(not isinstance(p, dict) or p.get("type") != "text" for p in content):
                raise ExchangeError(f"request.messages[{i}].content: only text parts can be recorded", "wrong_type")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise ExchangeError(f"request.messages[{i}].content: expected text", "wrong_type")
        out.append({"role": message["role"], "content": content})
    return out


def prompt_text(request: dict[str, Any], tokenizer: Any = None) -> str:
    """The prompt as fed to the model: a completion's `prompt`, or the messages through `tokenizer`'s chat
    template (as draftwheel serve applies it)."""
    if "messages" not in request:
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if isinstance(prompt, list):
            raise ExchangeError("request.prompt: several prompts (one record is one sequence)", "not_single_sequence")
        if not isinstance(prompt, str):
            raise ExchangeError("request.prompt: expected text", "missing_field" if prompt is None else "wrong_type")
        return prompt
    messages = _messages(request)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ExchangeError("chat request: no target tokenizer with a chat template to render the prompt as the "
                            "model saw it", "no_chat_template")
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def _ids(values: list[Any], name: str) -> list[int]:
    if any(isinstance(v, bool) or not isinstance(v, int) for v in values):
        raise ExchangeError(f"response {name}: expected token ids", "wrong_type")
    return list(values)


def record_from_exchange(request: Any, response: Any, *, source: str, tokenizer: Any = None,
                         header_slice: str | None = None, draft_id: ModelId | None = None,
                         ts: float | None = None, ttft_s: float = 0.0, latency_s: float = 0.0) -> AcceptanceRecord:
    """The acceptance record of one exchange (see the module docstring). `response`: a body (dict) or a
    streamed response's chunks (list). `draft_id`: the draft the server ran, when the caller knows it (kept
    only with speculative figures). `ts` defaults to the response's `created`, else now."""
    if not isinstance(request, dict):
        raise ExchangeError(f"request: expected a JSON object, got {type(request).__name__}", "not_an_object")
    if request.get("n") not in (None, 1):
        raise ExchangeError(f"request.n: {request.get('n')!r} sequences, one record is one", "not_single_sequence")
    chat = "messages" in request
    prompt = prompt_text(request, tokenizer)
    reply = fold_chunks(response, chat) if isinstance(response, list) else read_body(response, chat)
    metrics = reply.metrics if isinstance(reply.metrics, dict) else {}
    block = metrics.get("speculative_decoding")
    try:
        counts = reported_counts(block) if block is not None else None
    except ValueError as exc:
        raise ExchangeError(str(exc), "bad_metrics") from exc
    model = reply.model or request.get("model")
    record = AcceptanceRecord(
        request_id=uuid.uuid4().hex, ts=ts if ts is not None else reply.created or time.time(),
        slice=request_slice(request, header_slice), target_id=ModelId(name=str(model or "")),
        draft_id=draft_id if counts is not None else None, mode="draft" if counts is not None else "autoregressive",
        sampling=_sampling(request), prompt=prompt, prompt_token_ids=_ids(reply.prompt_token_ids, "prompt_token_ids"),
        output=reply.text, output_token_ids=_ids(reply.token_ids, "token_ids"),
        finish_reason=reply.finish_reason or "unknown", steps=[],
        drafted_tokens=counts.drafted if counts else 0, accepted_tokens=counts.accepted if counts else 0,
        verify_steps=counts.steps if counts else 0, ttft_s=ttft_s, latency_s=latency_s, source=source)
    try:
        check_record(record)
    except RecordError as exc:
        raise ExchangeError(str(exc), "wrong_type") from exc
    return record
