"""Suffix index: model-free drafts from the target's earlier outputs and from the current request.

The method is SuffixDecoding's (Oliaro et al. 2024, arXiv 2411.04975; snowflakedb/ArcticInference):
find earlier occurrences of the longest suffix of the current context and propose the continuation
most of them share. Each drafted token carries an estimated acceptance probability, the product of the
branch frequencies `count(child) / count(node)` along the path (an occurrence whose sequence ends
there counts in the denominator and never as a branch); the proposal's `score` is their sum (the
expected accepted length if the estimates were exact); drafting stops below `min_token_prob`. Match
lengths are tried longest first and the best score wins (ties: the longer match); a match of length m
may propose at most `m * spec_factor + spec_offset` tokens, so speculation length grows with match
length. The walk goes on to `m * stretch_factor + spec_offset` tokens: those past the first cap are the
proposal's `stretch`, outside its score, which a decoding loop verifies only as far as they pay for
their verify rows on this machine (draftwheel.serving.engine.adaptive.stretch_length). Two bounds on
the work, not in the tree version: once the best score reaches the next length's token limit the
search stops (exact: no shorter match can beat it), and at most `max_thresholds`
lengths are tried.

Here the suffix tree is replaced by a flat int32 token buffer (sequences separated by -1) and a table
from each `min_match`-gram to the buffer positions that follow it. A proposal takes the most recent
`max_candidates` positions of the context's last n-gram, measures how far back each one matches the
context (up to `max_depth` tokens, vectorised) and walks forward through their continuations: the same
counts the tree holds, for the recent occurrences only.

- `SuffixIndex`: the shared part, for one target (never mixed: records of another target are refused),
  bounded by `max_requests` and `max_tokens` with the oldest requests evicted first. `add(...)` is the
  update, O(tokens added + tokens evicted); `propose(...)` is a pure function of (index, context).
  `stats()`: its size and, over the suffix/hybrid records added, the share of steps it drafted.
  `from_logs(..., max_bytes)` builds it at start-up from the newest log files only.
- `RequestIndex`: the per-request part over the prompt and the output so far, keyed by single tokens
  (`request_min_match`).
- `best_proposal`: the better of both, as arctic-inference does.

Not here: verification or any model (draftwheel.serving.engine.suffix_decoding), reading config files, metrics.
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections import Counter, deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from draftwheel.serving.engine.acceptance import acceptance_rate
from draftwheel.serving.engine.records import SUFFIX, AcceptanceRecord, ModelId

_KEY_BITS = 21  # a token id must fit in 21 bits (vocabularies up to 2M) to pack 3 of them in one int64
_SEP = -1  # between sequences and after the end of the buffer: never equal to a token


@dataclass
class SuffixConfig:
    max_requests: int = 50_000
    """Shared index: most requests kept (oldest evicted first)."""
    max_tokens: int = 4_000_000
    """Shared index: most tokens kept (prompt + output of each request; oldest evicted first)."""
    min_match: int = 2
    """Shortest context suffix that may propose (the n-gram the table is keyed by), 1..3."""
    request_min_match: int = 1
    """The same for the per-request part. Its store is small (one prompt and output), so the
    `max_candidates` most recent occurrences of a single token still hold the longest matches, and
    one-token matches catch what an answer copies from its prompt (offline replay of the reference
    target: 40-60 % fewer steps without a proposal and +2.5-3.5 % modelled suffix-mode speed over
    min_match 2, on templated and on chat traffic, greedy and at temperature 0.7)."""
    max_depth: int = 32
    """Longest context suffix compared (tokens)."""
    max_candidates: int = 256
    """Most recent earlier occurrences considered per proposal."""
    max_thresholds: int = 8
    """Most match lengths tried per proposal (each is one walk): the longest, the shortest, some between."""
    max_spec_tokens: int = 16
    """Most tokens one proposal drafts."""
    spec_factor: float = 1.0
    """A match of length m drafts at most m * spec_factor + spec_offset tokens."""
    spec_offset: float = 0.0
    """See spec_factor."""
    stretch_factor: float = 2.0
    """A match of length m also offers the tokens up to m * stretch_factor + spec_offset, past the
    spec_factor cap, as the proposal's `stretch` (<= spec_factor: none). The cap guards against a short
    match's overconfident path probabilities; where a verify row costs little (bfloat16 on AMX: ~3 % of
    a step) the tokens past it still pay, where it costs much (float32 on AVX2: 15-27 %) they rarely do,
    so the decoding loop weighs them by their measured acceptance and the measured row cost."""
    min_token_prob: float = 0.1
    """Stop drafting when a token's estimated acceptance probability falls below this."""

    def __post_init__(self) -> None:
        for name in ("max_requests", "max_tokens", "max_depth", "max_candidates", "max_thresholds",
                     "max_spec_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: must be an int >= 1, got {value!r}")
        if self.max_spec_tokens >= 64:  # draftwheel.serving.engine.row_invariant.MAX_ROWS: longer verifies are not bitwise
            raise ValueError(f"max_spec_tokens: must be < 64 (a verify of 1 + max_spec_tokens rows must stay "
                             f"row-invariant), got {self.max_spec_tokens!r}")
        if self.min_match not in (1, 2, 3):
            raise ValueError(f"min_match: must be 1, 2 or 3, got {self.min_match!r}")
        if self.request_min_match not in (1, 2, 3):
            raise ValueError(f"request_min_match: must be 1, 2 or 3, got {self.request_min_match!r}")
        if self.max_depth < max(self.min_match, self.request_min_match):
            raise ValueError(f"max_depth: must be >= min_match and request_min_match "
                             f"({max(self.min_match, self.request_min_match)}), got {self.max_depth!r}")
        if self.spec_factor < 0 or self.spec_offset < 0:
            raise ValueError("spec_factor, spec_offset: must be >= 0")
        if self.stretch_factor < 0:
            raise ValueError(f"stretch_factor: must be >= 0, got {self.stretch_factor!r}")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob: must be in [0, 1], got {self.min_token_prob!r}")


@dataclass(frozen=True)
class Proposal:
    tokens: list[int] = field(default_factory=list)
    score: float = 0.0
    """Sum of the drafted tokens' estimated acceptance probabilities."""
    match_len: int = 0
    """Length of the context suffix the proposal continues."""
    probs: tuple[float, ...] = ()
    """Each drafted token's estimated acceptance probability (that of the whole path up to it); they sum
    to `score`."""
    stretch: tuple[int, ...] = ()
    """The walk's tokens past the match length's cap (SuffixConfig.stretch_factor), after `tokens`: not
    in `score`; a loop verifies a prefix of them (`stretched`)."""
    stretch_probs: tuple[float, ...] = ()
    """Their path probabilities, as `probs`."""

    def stretched(self, n: int) -> Proposal:
        """This proposal with the first n stretch tokens joined to its tokens (and their probabilities to
        its score); n = 0: the proposal as it is, stretch dropped."""
        if not self.stretch and not n:
            return self
        probs = self.probs + self.stretch_probs[:n]
        return Proposal(tokens=self.tokens + list(self.stretch[:n]), score=sum(probs), match_len=self.match_len,
                        probs=probs)


EMPTY = Proposal()


def _ngram_keys(tokens: np.ndarray, n: int) -> np.ndarray:
    """tokens[L] -> keys[L - n + 1]: key i packs tokens[i : i + n]."""
    keys = np.zeros(len(tokens) - n + 1, dtype=np.int64)
    for j in range(n):
        keys = (keys << _KEY_BITS) | tokens[j: len(tokens) - n + 1 + j].astype(np.int64)
    return keys


def _walk(rows: np.ndarray, limit: int, min_prob: float) -> tuple[list[int], list[float]]:
    """Follow the most frequent continuation of rows[C, K] (one row per occurrence, -1 = sequence
    ended) for at most `limit` tokens; return (tokens, their estimated path probabilities)."""
    tokens: list[int] = []
    probs: list[float] = []
    prob = 1.0
    for j in range(limit):
        column = rows[:, j]  # [C]
        counts = Counter(column[::-1].tolist())  # insertion order: most recent first, so ties go to it
        counts.pop(_SEP, None)
        if not counts:
            break
        token, count = max(counts.items(), key=lambda item: item[1])
        prob *= count / len(column)
        if prob < min_prob:
            break
        tokens.append(token)
        probs.append(prob)
        rows = rows[column == token]
    return tokens, probs


def _thresholds(match: np.ndarray, most: int) -> list[int]:
    """The distinct match lengths, longest first; when there are more than `most`, the longest, the
    shortest and evenly spaced ones between (a bound on the work of one proposal)."""
    lengths = np.unique(match)[::-1]
    if len(lengths) > most:
        lengths = lengths[np.unique(np.linspace(0, len(lengths) - 1, most).round().astype(int))]
    return lengths.tolist()


class TokenStore:
    """Token sequences in one flat buffer plus the n-gram -> following-positions table.

    Positions are absolute (they survive compaction); `_buf[i]` holds absolute position `_base + i`.
    The last sequence stays open (extendable) until `close()`. Not thread-safe on its own.
    """

    def __init__(self, order: int, capacity: int = 1024):
        self.order = order
        self._buf = np.full(capacity, _SEP, dtype=np.int32)
        self._base = 0  # absolute position of _buf[0]
        self._end = 0  # absolute position after the last stored token
        self._open_start: int | None = None  # absolute start of the open sequence
        self._table: dict[int, array] = {}
        self.sequences: deque[tuple[int, int]] = deque()  # closed sequences: (absolute start, length)
        self.tokens = 0  # tokens in closed and open sequences

    def _reserve(self, n: int) -> None:
        """Room for n more tokens, a separator and a trailing -1 (so reads past the end see -1):
        drop evicted space, growing the buffer when the live part fills more than half of it."""
        if self._end + n + 2 - self._base <= len(self._buf):
            return
        if self.sequences:
            live_start = self.sequences[0][0]
        else:
            live_start = self._end if self._open_start is None else self._open_start
        capacity = max(len(self._buf), 2 * (self._end + n + 2 - live_start))
        fresh = np.full(capacity, _SEP, dtype=np.int32)
        fresh[: self._end - live_start] = self._buf[live_start - self._base: self._end - self._base]
        self._buf, self._base = fresh, live_start

    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the open sequence (opening one if needed) and index the n-grams whose
        following token is now known."""
        if len(tokens) == 0:
            return
        if self._open_start is None:
            self._open_start = self._end
        self._reserve(len(tokens))
        old_len = self._end - self._open_start
        at = self._end - self._base
        self._buf[at: at + len(tokens)] = tokens
        self._end += len(tokens)
        self.tokens += len(tokens)
        first = max(self.order, old_len)  # sequence index of the first newly indexable continuation
        start = self._open_start - self._base
        seq = self._buf[start: self._end - self._base]
        if first < len(seq):
            keys = _ngram_keys(seq[first - self.order: len(seq) - 1], self.order)  # n-grams before first..end
            table = self._table
            for key, position in zip(keys.tolist(), range(self._open_start + first, self._end)):
                slot = table.get(key)
                if slot is None:
                    slot = table[key] = array("q")
                slot.append(position)

    def close(self) -> None:
        """End the open sequence; the next `extend` starts a new one after a separator."""
        if self._open_start is None:
            return
        self.sequences.append((self._open_start, self._end - self._open_start))
        self._open_start = None
        self._end += 1  # the separator slot (the buffer is -1 there already)

    def evict_oldest(self) -> None:
        """Forget the oldest closed sequence: its positions are the first entries of their n-grams."""
        start, length = self.sequences.popleft()
        self.tokens -= length
        if length <= self.order:
            return
        seq = self._buf[start - self._base: start - self._base + length]
        for key, count in Counter(_ngram_keys(seq[:-1], self.order).tolist()).items():
            slot = self._table[key]
            if len(slot) == count:
                del self._table[key]
            else:
                del slot[:count]

    def propose(self, context: Sequence[int], max_k: int, config: SuffixConfig) -> Proposal:
        """The best continuation of `context` (pure: reads the store, changes nothing)."""
        n = self.order
        depth = min(len(context), config.max_depth)
        if depth < n or max_k <= 0:
            return EMPTY
        ctx = np.asarray(context[len(context) - depth:], dtype=np.int64)  # [D]
        slot = self._table.get(int(_ngram_keys(ctx[-n:], n)[0]))
        if slot is None:
            return EMPTY
        rel = np.frombuffer(slot, dtype=np.int64)[-config.max_candidates:] - self._base  # [C]: next-token slots
        behind = rel[:, None] - 1 - np.arange(depth)  # [C, D]
        before = np.where(behind >= 0, self._buf[np.maximum(behind, 0)], _SEP)  # [C, D]
        match = np.cumprod(before == ctx[::-1][None, :], axis=1).sum(1)  # [C]
        ahead = np.minimum(rel[:, None] + np.arange(max_k), len(self._buf) - 1)  # [C, K]; past the end is -1
        following = self._buf[ahead]  # [C, K]
        best = EMPTY
        for m in _thresholds(match, config.max_thresholds):  # descending: a tie keeps the longer match
            limit = min(max_k, int(m * config.spec_factor + config.spec_offset + 1e-6))
            if best.score >= limit:  # a score never exceeds its limit, and limits only fall from here
                break
            reach = max(limit, min(max_k, int(m * config.stretch_factor + config.spec_offset + 1e-6)))
            tokens, probs = _walk(following[match >= m], reach, config.min_token_prob)
            if sum(probs[:limit]) > best.score:
                best = Proposal(tokens=tokens[:limit], score=sum(probs[:limit]), match_len=m,
                                probs=tuple(probs[:limit]), stretch=tuple(tokens[limit:]),
                                stretch_probs=tuple(probs[limit:]))
        return best

    def closed_sequences(self) -> list[list[int]]:
        """The closed sequences' tokens, oldest first."""
        return [self._buf[start - self._base: start - self._base + n].tolist() for start, n in self.sequences]

    def nbytes(self) -> int:
        """Approximate memory held: buffer, table, position arrays, keys (Python object sizes)."""
        table = sys.getsizeof(self._table) + sum(sys.getsizeof(k) + sys.getsizeof(v) for k, v in self._table.items())
        return self._buf.nbytes + table + sys.getsizeof(self.sequences)


def newest_within(files: list[Path], max_bytes: int) -> list[Path]:
    """The newest of `files` (oldest first) whose sizes sum to at most `max_bytes`; at least the newest one."""
    kept: list[Path] = []
    total = 0
    for path in reversed(files):
        total += path.stat().st_size if path.exists() else 0
        if kept and total > max_bytes:
            break
        kept.append(path)
    return kept[::-1]


def target_key(model_id: ModelId) -> str:
    """The key an index is kept under: the target's weights sha256, else its name and version."""
    return model_id.sha256 or f"{model_id.name}@{model_id.version}"


class SuffixIndex:
    """The shared index of earlier requests (prompt + output) of one target; bounded, thread-safe."""

    def __init__(self, target: str, config: SuffixConfig | None = None):
        self.target = target
        self.config = config or SuffixConfig()
        self._store = TokenStore(self.config.min_match)
        self._lock = threading.Lock()
        self.served = Counter()  # over the records added: requests/steps in modes suffix and hybrid, suffix steps

    @property
    def requests(self) -> int:
        return len(self._store.sequences)

    @property
    def tokens(self) -> int:
        return self._store.tokens

    def check_target(self, model_id: ModelId) -> None:
        """Raise `ValueError` unless this index was built for the target `model_id` names."""
        if target_key(model_id) != self.target:
            raise ValueError(f"suffix index: built for target {self.target!r}, not {model_id.name!r} "
                             f"({target_key(model_id)!r})")

    def add(self, token_ids: Sequence[int]) -> None:
        """Index one finished request's tokens (the last `max_tokens` if longer); evict the oldest
        requests until both bounds hold."""
        token_ids = list(token_ids)[-self.config.max_tokens:]
        with self._lock:
            self._store.extend(token_ids)
            self._store.close()
            while self.requests > self.config.max_requests or self.tokens > self.config.max_tokens:
                self._store.evict_oldest()

    def add_record(self, record: AcceptanceRecord) -> bool:
        """Index a record's prompt + output when it is of this index's target; False (skipped) if not."""
        if target_key(record.target_id) != self.target:
            return False
        self.add(record.prompt_token_ids + record.output_token_ids)
        if record.mode in ("suffix", "hybrid"):
            suffix_steps = [s for s in record.steps if s.source == SUFFIX]
            with self._lock:
                self.served.update(requests=1, steps=len(record.steps), suffix_steps=len(suffix_steps),
                                   suffix_drafted=sum(s.k for s in suffix_steps),
                                   suffix_accepted=sum(s.accepted for s in suffix_steps))
        return True

    def stats(self) -> dict[str, float | int]:
        """Size and use: kept requests and tokens, and over the suffix/hybrid records
        added (the log read at start-up included) `hit_rate`, the share of their verification steps the
        index drafted, and `suffix_acceptance_rate`, the share of its drafted tokens accepted."""
        with self._lock:
            served = dict(self.served)
            size = {"requests": self.requests, "tokens": self.tokens}  # not nbytes(): it walks the whole table
        steps, drafted = served.get("steps", 0), served.get("suffix_drafted", 0)
        return {**size, "served_requests": served.get("requests", 0), "served_steps": steps,
                "suffix_steps": served.get("suffix_steps", 0),
                "hit_rate": served.get("suffix_steps", 0) / steps if steps else 0.0,
                "suffix_acceptance_rate": acceptance_rate(served.get("suffix_accepted", 0), drafted)}

    def propose(self, context: Sequence[int], max_k: int) -> Proposal:
        with self._lock:
            return self._store.propose(context, min(max_k, self.config.max_spec_tokens), self.config)

    def request(self, prompt_ids: Sequence[int]) -> RequestIndex:
        """A per-request index over `prompt_ids`, with this index's config."""
        return RequestIndex(prompt_ids, self.config)

    def sequences(self) -> list[list[int]]:
        """The kept requests' tokens (prompt + output), oldest first."""
        with self._lock:
            return self._store.closed_sequences()

    def nbytes(self) -> int:
        with self._lock:
            return self._store.nbytes()

    @classmethod
    def from_records(cls, records: Iterable[AcceptanceRecord], target: str,
                     config: SuffixConfig | None = None) -> SuffixIndex:
        index = cls(target, config)
        for record in records:
            index.add_record(record)
        return index

    @classmethod
    def from_logs(cls, log_dir: str | Path, target: str, config: SuffixConfig | None = None,
                  max_bytes: int | None = None) -> SuffixIndex:
        """Built from an acceptance-log dir in write order, bad lines skipped; with `max_bytes`, only the
        newest files whose sizes (on disk) sum to at most that, and always the newest one (a bound on start-up)."""
        from draftwheel.serving.engine.sink import log_files, valid_records

        files = log_files(log_dir)
        if max_bytes is not None:
            files = newest_within(files, max_bytes)
        return cls.from_records(valid_records(files), target, config)


class ReadOnlyIndex:
    """A view of a `SuffixIndex` that proposes but learns nothing: measurements that run several engines
    on the same prompt give each this view, so none drafts from another's output of that prompt."""

    def __init__(self, index: SuffixIndex):
        self.index = index
        self.config = index.config

    def check_target(self, model_id: ModelId) -> None:
        self.index.check_target(model_id)

    def propose(self, context: Sequence[int], max_k: int) -> Proposal:
        return self.index.propose(context, max_k)

    def add_record(self, record: AcceptanceRecord) -> bool:
        return False


class RequestIndex:
    """The per-request part: the prompt and the output so far, as one growing sequence."""

    def __init__(self, prompt_ids: Sequence[int], config: SuffixConfig | None = None):
        self.config = config or SuffixConfig()
        self._store = TokenStore(self.config.request_min_match, capacity=max(1024, 2 * len(prompt_ids)))
        self._store.extend(list(prompt_ids))

    def extend(self, tokens: Sequence[int]) -> None:
        self._store.extend(tokens)

    def propose(self, context: Sequence[int], max_k: int) -> Proposal:
        return self._store.propose(context, min(max_k, self.config.max_spec_tokens), self.config)


def best_proposal(context: Sequence[int], max_k: int, *parts: SuffixIndex | RequestIndex | None) -> Proposal:
    """The highest-scoring proposal of the given parts (the first one wins a tie)."""
    best = EMPTY
    for part in parts:
        if part is not None:
            proposal = part.propose(context, max_k)
            if proposal.score > best.score:
                best = proposal
    return best
