"""Responses in vLLM's documented shape (a server started with `--per-request-spec-decode-metrics summary`).

The speculative block is the documentation's own example: 43 verify steps drafting 3 tokens each (129
drafted), 10 drafted tokens accepted, histogram [39, 1, 0, 3] (39 steps accepted none, 1 accepted one,
3 accepted all three), so mean acceptance length 1 + 10/43 and draft acceptance rate 10/129. Streamed
responses carry it on the final usage chunk (`choices: []`), which vLLM sends only with
`stream_options.include_usage`.
"""

from __future__ import annotations

import json

SPEC = {"mean_acceptance_length": 1 + 10 / 43, "draft_acceptance_rate": 10 / 129,
        "acceptance_histogram": [39, 1, 0, 3], "acceptance_histogram_by_draft_length": {"3": [39, 1, 0, 3]},
        "num_spec_steps": 43, "num_accepted_draft_tokens": 10, "num_draft_tokens": 129, "num_spec_tokens": 3}
MODEL = "Qwen/Qwen3-0.6B"
CREATED = 1787366173
USAGE = {"prompt_tokens": 11, "completion_tokens": 53, "total_tokens": 64}


def completion(text: str = "alpha beta gamma", metrics: bool = True) -> dict:
    body = {"id": "cmpl-7", "object": "text_completion", "created": CREATED, "model": MODEL,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                         "stop_reason": None, "prompt_logprobs": None}],
            "usage": USAGE, "system_fingerprint": "vllm-0.32.0"}
    return {**body, "metrics": {"speculative_decoding": SPEC}} if metrics else body


def chat(text: str = "Hello there!", metrics: bool = True) -> dict:
    body = {"id": "chatcmpl-7", "object": "chat.completion", "created": CREATED, "model": MODEL,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "refusal": None,
                                                 "tool_calls": []},
                         "logprobs": None, "finish_reason": "stop", "stop_reason": None}],
            "usage": USAGE, "prompt_logprobs": None}
    return {**body, "metrics": {"speculative_decoding": SPEC}} if metrics else body


def chat_chunks(pieces: tuple[str, ...] = ("Hello", " there", "!"), usage: bool = True) -> list[dict]:
    """A streamed chat completion: role chunk, content chunks, finish chunk, then (with `usage`) the usage chunk."""
    head = {"id": "chatcmpl-8", "object": "chat.completion.chunk", "created": CREATED, "model": MODEL}
    chunks = [{**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                    "finish_reason": None}]}]
    chunks += [{**head, "choices": [{"index": 0, "delta": {"content": p}, "logprobs": None, "finish_reason": None}]}
               for p in pieces]
    chunks.append({**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop",
                                        "stop_reason": None}]})
    if usage:
        chunks.append({**head, "choices": [], "usage": USAGE, "metrics": {"speculative_decoding": SPEC}})
    return chunks


def completion_chunks(pieces: tuple[str, ...] = ("alpha", " beta"), usage: bool = True) -> list[dict]:
    head = {"id": "cmpl-9", "object": "text_completion", "created": CREATED, "model": MODEL}
    chunks = [{**head, "choices": [{"index": 0, "text": p, "logprobs": None, "finish_reason": None}]}
              for p in pieces]
    chunks.append({**head, "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length"}]})
    if usage:
        chunks.append({**head, "choices": [], "usage": USAGE, "metrics": {"speculative_decoding": SPEC}})
    return chunks


def sse(chunks: list[dict]) -> bytes:
    """The bytes vLLM streams: one `data: JSON` event per chunk, then `data: [DONE]`."""
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"
