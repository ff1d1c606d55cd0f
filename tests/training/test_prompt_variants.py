"""Prompt variants: multi-line requests cut short, re-templated as serving encodes them."""

from __future__ import annotations

import random
import re

from draftwheel.serving.testing import build_tokenizer
from draftwheel.training.prompt_variants import (chat_frame, cut_lines, defined_names, renamed_message, user_message,
                                      variant_messages, variant_prompts)
from draftwheel.training.target_completions import encode_prompt

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


OTHER = "Finish this:\n\ndef total_cost(items, rate=0.2):\n    for item, qty in items:\n        subtotal: float = qty\n    return subtotal"


def test_defined_names_are_the_snippets_own_not_the_languages():
    assert defined_names(FUNCTION) == ["area"]  # w, h, a: one letter, also words of prose
    assert defined_names(OTHER) == ["total_cost", "items", "rate", "subtotal", "item", "qty"]
    assert defined_names("class Stack(list):\n    def push(self, *args, **kw):\n        if x == 1: pass") == \
        ["Stack", "push", "args", "kw"]  # self, the comparison and the builtin base are not names it defines
    assert defined_names("Tell me a fun fact about birds.") == []


def test_renamed_message_swaps_every_defined_name_consistently_for_unused_ones():
    fresh = ["width", "height", "depth", "scale", "offset", "label"]
    renamed = renamed_message(OTHER, defined_names(OTHER) + fresh, random.Random(0))  # its own names: never drawn
    assert renamed is not None
    names = defined_names(renamed)
    assert sorted(names) == sorted(fresh)
    expected = OTHER
    for old, new in zip(defined_names(OTHER), names):  # the same swap wherever the name appears
        expected = re.sub(rf"\b{old}\b", new, expected)
    assert renamed == expected and renamed.count("for ") == 1 and "return " in renamed  # keywords untouched
    assert renamed_message(OTHER, fresh[:5], random.Random(0)) is None  # too few fresh names to draw
    assert renamed_message("Write a poem about the sea.", fresh, random.Random(0)) is None


def test_variant_prompts_add_renamed_requests_beside_the_cut_ones():
    tokenizer = build_tokenizer()
    _, code = encode_prompt(tokenizer, OTHER, chat=True)
    _, more = encode_prompt(tokenizer, FUNCTION.replace("area", "volume_of_box"), chat=True)
    cut_only, _ = variant_prompts([code, more], ["code", "code"], tokenizer, 1, 10_000)
    ids, slices = variant_prompts([code, more], ["code", "code"], tokenizer, 1, 10_000, renames=1, seed=3)
    # OTHER defines six names and the slice has one it does not use: not renamed; the box function is
    assert ids[:2] == cut_only and len(ids) == 3 and slices == ["code"] * 3
    renamed = user_message(tokenizer.decode(ids[2], skip_special_tokens=False), chat_frame(tokenizer))
    assert "volume_of_box" not in renamed and defined_names(renamed)[0] in defined_names(OTHER)
    assert ids == variant_prompts([code, more], ["code", "code"], tokenizer, 1, 10_000, renames=1, seed=3)[0]
    twice, _ = variant_prompts([code, more], ["code", "code"], tokenizer, 0, 10_000, renames=2, seed=1)
    assert len(twice) == 2 and twice[0] != twice[1]  # two draws, two requests (a repeated draw would count once)
