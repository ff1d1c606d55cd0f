"""Prompt variants: more requests of a mined slice, made from the requests the round has.

A round sees few requests of a new slice (80 code requests on the shifted workload), and what it gains is bounded by
how much of the slice it has seen: twice the traffic bought 7 points of live gain, four epochs on the
same traffic under 1. A request whose message runs over several lines, cut one or more
lines short, is another request of the same kind -- the same function with one body line fewer, the
same list with one item fewer -- and the target's greedy answer to it is more of what serving will be
asked to draft: new positions on the target's own path, for the price of generating them. The trainer
appends the cut prompts with no answer; the continuation step (`continue_to`) then answers them in the
same batched generation that lengthens the logged outputs, features included (draftwheel.training.eagle_train).

Only the user message is cut, inside the chat template's frame; a closing ``` fence is kept. Messages
left with fewer than MIN_LINES lines give none, so one-line requests (most chat and prose) give none.

Renames (`renamed_message`): the same request with every name its code defines swapped for names other
requests of the slice define. The target's answers restate the request's code (a shift to code: 64 % of the
code answers' positions), and a draft trained on few requests learns their identifiers, which live
traffic does not repeat; on a renamed request those positions can be drafted only by copying.
Regular expressions, not Python's tokenizer: the requests are often cut mid-statement.
"""

from __future__ import annotations

import builtins
import keyword
import random
import re
from typing import Any

MIN_LINES = 4  # an instruction, a blank line, and two lines of what it is about
MARKER = "\x00draftwheel-message\x00"


def chat_frame(tokenizer: Any) -> tuple[str, str] | None:
    """The templated text before and after a single user message (system prompt, turn markers, the
    generation prompt), or None for a tokenizer without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARKER}], add_generation_prompt=True,
                                         tokenize=False)
    before, _, after = text.partition(MARKER)
    return before, after


def user_message(prompt_text: str, frame: tuple[str, str]) -> str | None:
    """The user message of a prompt templated as `frame` (one user turn), else None."""
    before, after = frame
    if len(prompt_text) < len(before) + len(after) or not (prompt_text.startswith(before)
                                                         and prompt_text.endswith(after)):
        return None
    return prompt_text[len(before):len(prompt_text) - len(after)]


def cut_lines(message: str, lines_cut: int) -> str | None:
    """`message` without its last `lines_cut` lines (a closing ``` fence stays), or None when fewer than
    MIN_LINES lines would be left."""
    lines = message.split("\n")
    fence = len(lines) > 1 and lines[-1].strip() == "```"
    body = lines[:-1] if fence else lines
    if len(body) - lines_cut < MIN_LINES:
        return None
    return "\n".join(body[:-lines_cut] + (lines[-1:] if fence else []))


def variant_messages(message: str, n: int) -> list[str]:
    """`message` cut 1..n lines short, those that are long enough."""
    return [v for cut in range(1, n + 1) if (v := cut_lines(message, cut)) is not None]


_DEF = re.compile(r"\b(?:def|class)\s+(\w+)\s*(?:\(([^)]*)\))?")
_ASSIGNED = re.compile(r"^[ \t]*(\w+)[ \t]*(?::[^=\n]*)?=(?!=)", re.MULTILINE)
_LOOP = re.compile(r"\bfor\s+([\w, ]+?)\s+in\b")
_KEEP = set(keyword.kwlist) | set(dir(builtins)) | {"self", "cls", "_"}


def defined_names(text: str) -> list[str]:
    """The names a code snippet defines, in order of first appearance: function and class names,
    parameters, assigned and loop variables (not attributes, keywords, builtins, self/cls, one-letter
    names or dunders)."""
    found: list[str] = []
    for match in _DEF.finditer(text):
        found.append(match.group(1))
        for param in (match.group(2) or "").split(","):
            if name := re.match(r"\s*\**\s*(\w+)", param):
                found.append(name.group(1))
    found += _ASSIGNED.findall(text)
    for targets in _LOOP.findall(text):
        found += [t.strip() for t in targets.split(",")]
    # One-letter names are also words of the docstring ("a"); dunders are the language's, not the request's.
    return [n for n in dict.fromkeys(found)
            if n.isidentifier() and n not in _KEEP and len(n) > 1 and not n.startswith("__")]


def renamed_message(message: str, pool: list[str], rng: random.Random) -> str | None:
    """`message` with every name it defines replaced, consistently, by one drawn from `pool` (names other
    requests of the slice define) that it does not already use; None when it defines none or the pool
    has too few such names. Why renames: the module docstring."""
    names = defined_names(message)
    used = set(re.findall(r"\w+", message))
    fresh = [p for p in dict.fromkeys(pool) if p not in used]
    if not names or len(fresh) < len(names):
        return None
    mapping = dict(zip(names, rng.sample(fresh, len(names))))
    return re.sub(r"\b\w+\b", lambda m: mapping.get(m.group(0), m.group(0)), message)


def variant_prompts(prompts: list[list[int]], slices: list[str], tokenizer: Any, n: int,
                    max_prompt_tokens: int, renames: int = 0, seed: int = 0) -> tuple[list[list[int]], list[str]]:
    """(token ids, slice) of the distinct variants of `prompts` (templated prompt ids): each cut 1..n lines
    short and `renames` times renamed (`renamed_message`, names drawn from the same slice's requests),
    each re-templated as serving encodes a request, at most `max_prompt_tokens` long; none that is one
    of `prompts` itself."""
    from draftwheel.training.target_completions import encode_prompt

    frame = chat_frame(tokenizer)
    if frame is None or (n < 1 and renames < 1):
        return [], []
    seen = {tuple(p) for p in prompts}
    messages = [user_message(tokenizer.decode(ids, skip_special_tokens=False), frame) for ids in prompts]
    pools: dict[str, list[str]] = {}
    for message, name in zip(messages, slices):
        pools.setdefault(name, []).extend(defined_names(message) if message is not None else [])
    rng = random.Random(seed)
    ids_out: list[list[int]] = []
    slices_out: list[str] = []
    for message, name in zip(messages, slices):
        if message is None or len(message.split("\n")) < MIN_LINES:
            continue
        variants = variant_messages(message, n)
        variants += [v for _ in range(renames) if (v := renamed_message(message, pools[name], rng)) is not None]
        for variant in variants:
            _, variant_ids = encode_prompt(tokenizer, variant, chat=True)
            if len(variant_ids) <= max_prompt_tokens and tuple(variant_ids) not in seen:
                seen.add(tuple(variant_ids))
                ids_out.append(variant_ids)
                slices_out.append(name)
    return ids_out, slices_out
