"""PII scrubbing: e-mails, phone numbers, card numbers, IP addresses and secrets -> typed placeholders.

Regular expressions find candidates and a check confirms each one (Luhn for cards, `ipaddress` and
octet ranges for IPs, a context check that spares version strings such as `version 1.2.3.4`), so
near-misses like `3.11.7`, dates, times, `x[1::2]` and digit runs that fail Luhn stay as they are.
Placeholders: `<SECRET>`, `<EMAIL>`, `<CARD>`, `<IP>`, `<PHONE>`; rules run in that order, so a key
containing digits is one secret, not a phone number. Every pattern starts with a literal or a narrow
character class and is gated by a substring test, which keeps scrubbing at microseconds per text.
Presidio would add NER-based names and addresses at the cost of a spaCy model; this module covers
pattern-shaped PII only and does not detect names or street addresses.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from collections.abc import Callable

Span = tuple[int, int]

_SECRETS = [
    ("-----BEGIN", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL)),
    ("sk-", re.compile(r"sk-(?:[a-z]+-)?[A-Za-z0-9_-]{20,}")),                  # OpenAI-style (sk-..., sk-proj-...)
    ("AKIA", re.compile(r"AKIA[0-9A-Z]{16}(?![0-9A-Za-z])")),                    # AWS access key ids
    ("ASIA", re.compile(r"ASIA[0-9A-Z]{16}(?![0-9A-Za-z])")),
    ("_", re.compile(r"gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,}")),  # GitHub tokens
    ("xox", re.compile(r"xox[abprs]-[A-Za-z0-9-]{10,}")),                        # Slack
    ("AIza", re.compile(r"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])")),              # Google API keys
    ("eyJ", re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),  # JWTs
    ("earer", re.compile(r"[Bb]earer ([A-Za-z0-9._~+/-]{16,}=*)")),              # the token after "Bearer "
]
_EMAIL_DOMAIN = re.compile(r"@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}\b")
_EMAIL_LOCAL = re.compile(r"[A-Za-z0-9._%+-]{1,64}$")
_CARD = re.compile(r"[0-9](?:[ -]?[0-9]){12,18}(?![0-9])")  # 13-19 digits, single space/dash groups allowed
_IPV4 = re.compile(r"[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}(?!\w|\.\d)")
_IPV6_GATE = re.compile(r":[0-9A-Fa-f]{0,4}:")
_IPV6 = re.compile(r"[0-9A-Fa-f]{0,4}:[0-9A-Fa-f]{0,4}(?::[0-9A-Fa-f]{0,4}){1,6}(?![\w:])")
_PHONES = [
    ("+", re.compile(r"\+\d{1,3}(?:[ .-]?\(\d{1,4}\))?(?:[ .-]?\d{2,4}){2,5}(?!\w)")),  # international
    ("(", re.compile(r"\(\d{3}\)\s?\d{3}[ .-]\d{4}(?!\w|[.-]\d)")),                     # (555) 123-4567
    ("", re.compile(r"[0-9]{3}[ .-][0-9]{3}[ .-][0-9]{4}(?!\w|[.-]\d)")),                        # 555-123-4567
]
# A dotted quad right after one of these is a version, not an address.
_VERSION_CONTEXT = re.compile(r"(?i)(?:\bv|\bversion\s*|\brelease\s*|[=<>~!]=\s*|\bpython\s*)$")


def luhn_ok(digits: str) -> bool:
    """The Luhn checksum that every payment card number satisfies."""
    total = 0
    for position, char in enumerate(reversed(digits)):
        value = int(char)
        if position % 2 == 1:
            value = value * 2 - 9 if value > 4 else value * 2
        total += value
    return total % 10 == 0


def _free_before(match: re.Match[str], also: str = "") -> bool:
    """The match does not continue a word (or one of `also`) to its left."""
    start = match.start()
    if start == 0:
        return True
    before = match.string[start - 1]
    return not (before.isalnum() or before == "_" or before in also)


def _secret(match: re.Match[str]) -> Span | None:
    if match.re.groups:  # bearer: redact the token, keep the word
        return match.span(1)
    return match.span() if match.group().startswith(("-----", "eyJ")) or _free_before(match) else None


def _email(match: re.Match[str]) -> Span | None:
    local = _EMAIL_LOCAL.search(match.string, max(0, match.start() - 64), match.start())
    if local is None or local.start() > 0 and match.string[local.start() - 1] in "._%+-":
        return None
    return local.start(), match.end()


def _card(match: re.Match[str]) -> Span | None:
    digits = re.sub(r"[ -]", "", match.group())
    ok = _free_before(match, ".-") and 13 <= len(digits) <= 19 and luhn_ok(digits)
    return match.span() if ok else None


def _ipv4(match: re.Match[str]) -> Span | None:
    if not _free_before(match, ".") or any(int(octet) > 255 for octet in match.group().split(".")):
        return None
    before = match.string[max(0, match.start() - 12):match.start()]
    return None if _VERSION_CONTEXT.search(before) else match.span()


def _ipv6(match: re.Match[str]) -> Span | None:
    text = match.group()
    if not _free_before(match, ":."):
        return None
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return None
    groups = [g for g in text.split(":") if g]
    # Slices like `x[1::2]` and `::` parse as IPv6; real addresses have a full 4-digit group or 4+ groups.
    return match.span() if len(groups) >= 4 or (len(groups) >= 2 and any(len(g) == 4 for g in groups)) else None


def _phone(match: re.Match[str]) -> Span | None:
    return match.span() if _free_before(match, "+.-") else None


def _has(substring: str) -> Callable[[str], bool]:
    return lambda text: substring in text


# (placeholder type, cheap gate, pattern, check returning the span to replace or None), in order.
_RULES: list[tuple[str, Callable[[str], bool], re.Pattern[str], Callable[[re.Match[str]], Span | None]]] = [
    *[("SECRET", _has(trigger), pattern, _secret) for trigger, pattern in _SECRETS],
    ("EMAIL", _has("@"), _EMAIL_DOMAIN, _email),
    ("CARD", _has(""), _CARD, _card),
    ("IP", lambda t: _IPV6_GATE.search(t) is not None, _IPV6, _ipv6),
    ("IP", _has("."), _IPV4, _ipv4),
    *[("PHONE", _has(trigger), pattern, _phone) for trigger, pattern in _PHONES],
]


class Scrubber:
    """Replaces PII with typed placeholders and counts replacements per type in `self.counts`."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()

    def scrub(self, text: str) -> str:
        for kind, gate, pattern, check in _RULES:
            if gate(text):
                text = self._apply(text, kind, pattern, check)
        return text

    def _apply(self, text: str, kind: str, pattern: re.Pattern[str], check: Callable) -> str:
        pieces, last = [], 0
        for match in pattern.finditer(text):
            span = check(match)
            if span is None or span[0] < last:
                continue
            pieces += [text[last:span[0]], f"<{kind}>"]
            last = span[1]
            self.counts[kind] += 1
        return text if not pieces else "".join(pieces) + text[last:]


def scrub(text: str) -> tuple[str, Counter[str]]:
    """One-off scrub: (scrubbed text, counts per type)."""
    scrubber = Scrubber()
    return scrubber.scrub(text), scrubber.counts


def contains_pii(text: str) -> bool:
    """Whether scrubbing would change `text` (nothing is counted)."""
    return Scrubber().scrub(text) != text
