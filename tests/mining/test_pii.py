"""PII scrubbing: each kind becomes its typed placeholder and is counted; near-misses stay untouched."""

from __future__ import annotations

import pytest

from draftwheel.mining.pii import Scrubber, contains_pii, luhn_ok, scrub


@pytest.mark.parametrize("text, expected, kind", [
    ("mail john.doe+news@example.co.uk today", "mail <EMAIL> today", "EMAIL"),
    ("(contact: a_b@sub.example.org)", "(contact: <EMAIL>)", "EMAIL"),
    ("card 4111 1111 1111 1111 expires", "card <CARD> expires", "CARD"),
    ("card 4111-1111-1111-1111.", "card <CARD>.", "CARD"),
    ("amex 378282246310005", "amex <CARD>", "CARD"),
    ("server 10.0.0.1 is down", "server <IP> is down", "IP"),
    ("from 192.168.1.254:8080", "from <IP>:8080", "IP"),
    ("ipv6 2001:db8::ff00:42:8329 here", "ipv6 <IP> here", "IP"),
    ("full 2001:0db8:85a3:0000:0000:8a2e:0370:7334", "full <IP>", "IP"),
    ("link-local fe80::1ff:fe23:4567:890a", "link-local <IP>", "IP"),
    ("call +1 (555) 123-4567 now", "call <PHONE> now", "PHONE"),
    ("call +44 20 7946 0958", "call <PHONE>", "PHONE"),
    ("office 555-123-4567.", "office <PHONE>.", "PHONE"),
    ("office (555) 123-4567", "office <PHONE>", "PHONE"),
    ("key=sk-proj-abcdefghijklmnopqrstuvwxyz0123", "key=<SECRET>", "SECRET"),
    ("OPENAI_API_KEY=sk-abcdefghijklmnopqrstuvwx", "OPENAI_API_KEY=<SECRET>", "SECRET"),
    ("aws AKIAIOSFODNN7EXAMPLE", "aws <SECRET>", "SECRET"),
    ("token ghp_" + "a1B2" * 9, "token <SECRET>", "SECRET"),
    ("Authorization: Bearer abc.def-ghi_jkl~mno+pqr/stu=", "Authorization: Bearer <SECRET>", "SECRET"),
    ("slack xoxb-1234567890-abcdefghij", "slack <SECRET>", "SECRET"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "<SECRET>", "SECRET"),
])
def test_pii_is_replaced_by_a_typed_placeholder_and_counted(text, expected, kind):
    clean, counts = scrub(text)
    assert clean == expected
    assert counts == {kind: 1}


@pytest.mark.parametrize("text", [
    "Python 3.11.7 was released; numpy 1.26.4 too",   # version numbers
    "on 2024-01-15 at 12:30:45, or 15/01/2024",       # dates and times
    "order 4111111111111112 is not a card",            # 16 digits failing Luhn
    "id 1234567812345678 and 12345678901234567890123",  # non-Luhn run, and a 23-digit run
    "version 1.2.3.4 and v10.0.0.1 and numpy==1.2.3.4",  # IP-shaped versions after a version word
    "a.b.c 1.2.3.4.5 and 256.1.1.1",                   # five parts; octet out of range
    "slices x[1::2] and a::b, C++ std::vector, 12:30:45, mac 00:1A:2B:3C:4D:5E",
    "sklearn sk-learn sk-short",                        # sk- without a long key
    "@property\ndef f(self): return self.x @ self.y",   # decorators and matmul, not e-mail
    "user@localhost and x@y",                           # no dotted domain
    "phone 5551234567 plain digits",                    # bare digit runs are not phones
    "AKIA is short here",
])
def test_near_misses_are_not_redacted(text):
    clean, counts = scrub(text)
    assert clean == text and not counts
    assert not contains_pii(text)


def test_luhn():
    assert luhn_ok("4111111111111111") and luhn_ok("378282246310005") and luhn_ok("5555555555554444")
    assert not luhn_ok("4111111111111112") and not luhn_ok("1234567812345678")


def test_counts_accumulate_per_type_across_texts():
    scrubber = Scrubber()
    scrubber.scrub("a@example.com b@example.com 10.1.2.3")
    scrubber.scrub("4111 1111 1111 1111 and c@example.com")
    assert scrubber.counts == {"EMAIL": 3, "IP": 1, "CARD": 1}


def test_a_secret_containing_digits_is_one_secret_not_a_phone():
    clean, counts = scrub("ghp_5551234567555123456755512345675551234567")
    assert clean == "<SECRET>" and counts == {"SECRET": 1}
