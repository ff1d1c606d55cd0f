"""The growing output of one request and its stop conditions (EOS, stop strings, max tokens).

`OutputState` receives the tokens each decoding step emits, cuts them at the first stop condition and
keeps the text. It also computes streaming-safe text: the part that can no longer change (no
half-decoded UTF-8 character, no possible beginning of a stop string). It knows nothing of models.
"""

from __future__ import annotations

from typing import Any


class OutputState:
    def __init__(self, tokenizer: Any, eos_ids: set[int], stop: list[str], max_new_tokens: int):
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.stop = stop
        self.max_new_tokens = max_new_tokens
        self.token_ids: list[int] = []
        self.finish_reason: str | None = None
        self._text = ""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.token_ids)

    @property
    def text(self) -> str:
        return self._text

    def _decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True)

    def extend(self, tokens: list[int]) -> None:
        """Append one step's tokens, stopping at EOS (kept in token_ids), max tokens or a stop string."""
        if self.finished:
            return
        for token in tokens:
            self.token_ids.append(token)
            if token in self.eos_ids:
                self.finish_reason = "stop"
                break
            if len(self.token_ids) >= self.max_new_tokens:
                self.finish_reason = "length"
                break
        self._text = self._decode(self.token_ids)
        if self.stop:
            self._cut_at_stop()

    def _cut_at_stop(self) -> None:
        positions = [p for p in (self._text.find(s) for s in self.stop) if p >= 0]
        if not positions:
            return
        # Keep the fewest tokens whose text reaches the stop string, so token ids match the text. The
        # stop string may have begun in an earlier step's tokens (it was incomplete then).
        cut = min(positions)
        for n in range(1, len(self.token_ids) + 1):
            if len(self._decode(self.token_ids[:n])) > cut:
                del self.token_ids[n:]
                break
        self._text = self._text[:cut]
        self.finish_reason = "stop"

    def stable_text(self) -> str:
        """Text that later tokens cannot change: everything once finished, else held back as needed."""
        if self.finished:
            return self._text
        text = self._text.rstrip("\ufffd")  # an incomplete multi-byte character decodes to U+FFFD
        hold = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), 0, -1):
                if text.endswith(s[:n]):
                    hold = max(hold, n)
                    break
        return text[: len(text) - hold]
