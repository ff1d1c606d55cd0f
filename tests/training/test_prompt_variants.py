"""Prompt variants: multi-line requests cut short, re-templated as serving encodes them."""

from __future__ import annotations

from serving.toy import build_tokenizer
from training.prompt_variants import chat_frame, cut_lines, user_message, variant_messages, variant_prompts
from training.target_completions import encode_prompt

FUNCTION = "Complete this Python function:\n\n```python\ndef area(w, h):\n    \"\"\"Area.\"\"\"\n    a = w * h\n    return a\n```"


def test_cut_keeps_the_closing_fence_and_stops_at_min_lines():
    assert cut_lines(FUNCTION, 1) == ("Complete this Python function:\n\n```python\ndef area(w, h):\n"
                                      "    \"\"\"Area.\"\"\"\n    a = w * h\n```")
    assert cut_lines(FUNCTION, 2).endswith("\"\"\"Area.\"\"\"\n```")
    assert cut_lines(FUNCTION, 3) is not None  # instruction, blank, fence line, signature
    assert cut_lines(FUNCTION, 4) is None
    assert variant_messages(FUNCTION, 9) == [cut_lines(FUNCTION, j) for j in (1, 2, 3)]
    assert variant_messages("Write a poem about the sea.", 2) == []  # one line: nothing to cut
    assert cut_lines("a\nb\nc\nd\ne", 1) == "a\nb\nc\nd"  # no fence: the last line goes


def test_user_message_round_trips_through_the_template():
    tokenizer = build_tokenizer()
    frame = chat_frame(tokenizer)
    text, ids = encode_prompt(tokenizer, FUNCTION, chat=True)
    assert user_message(text, frame) == FUNCTION
    assert user_message(tokenizer.decode(ids, skip_special_tokens=False), frame) == FUNCTION
    assert user_message("not a templated prompt", frame) is None


def test_variant_prompts_are_distinct_encoded_requests_of_the_same_slice():
    tokenizer = build_tokenizer()
    _, code = encode_prompt(tokenizer, FUNCTION, chat=True)
    _, chat = encode_prompt(tokenizer, "Tell me a fun fact about birds.", chat=True)
    ids, slices = variant_prompts([code, code, chat], ["code", "code", "chat"], tokenizer, 2, 10_000)
    expected = [encode_prompt(tokenizer, cut_lines(FUNCTION, j), chat=True)[1] for j in (1, 2)]
    assert ids == expected  # the repeated request gives its variants once; the one-line chat none
    assert slices == ["code", "code"]
    short, _ = variant_prompts([code], ["code"], tokenizer, 2, len(expected[1]))
    assert short == [expected[1]]  # longer than the limit: dropped
    assert variant_prompts([code], ["code"], tokenizer, 0, 10_000) == ([], [])
    tokenizer.chat_template = None
    assert variant_prompts([code], ["code"], tokenizer, 2, 10_000) == ([], [])  # no template: no frame to cut in
