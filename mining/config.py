"""`MiningConfig`: the typed settings of the mining stage (`configs/mining.yaml`).

Loaded with `draftwheel.config.load_config(MiningConfig, path, overrides)`; unknown keys are rejected
there, and `__post_init__` here rejects bad values with a `ValueError` naming the field. This module
holds settings only; the stage itself is `draftwheel.mining.pipeline.mine`.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field


def parse_time(value: str | None) -> float | None:
    """`None`, unix seconds (`"1764000000.5"`) or ISO 8601 (`"2026-11-30T09:00:00Z"`, UTC if naive) -> unix seconds."""
    if value is None or value == "":
        return None
    try:
        return float(value)
    except ValueError:
        pass
    stamp = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=dt.timezone.utc)
    return stamp.timestamp()


def format_time(ts: float) -> str:
    """Unix seconds -> ISO 8601 in UTC to the second (`"2026-11-30T09:00:00+00:00"`): what `parse_time` reads."""
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class MiningConfig:
    since: str | None = None
    """Keep requests with ts >= since (unix seconds or ISO 8601; None = no lower bound)."""
    until: str | None = None
    """Keep requests with ts < until (unix seconds or ISO 8601; None = no upper bound)."""
    focus_after: str | None = None
    """Draw the hard, rollback and uniform samples only from requests with ts > focus_after (unix seconds
    or ISO 8601; None = from all). The flywheel sets it to the newest request its last round mined, so a
    round learns the traffic served since while earlier rounds' rows come from the retained corpus. The
    hold-out is then the latest `holdout_fraction` of that traffic; the replay share still reads every
    kept request."""
    slices: list[str] = field(default_factory=list)
    """Keep only these slices (empty = all)."""
    skip_suffix_served_above: float | None = None
    """Skip requests whose suffix-drafted steps (`source: suffix`) have a mean accepted length above this:
    the suffix tier already serves them well, so they need no training (None = keep them)."""
    holdout_fraction: float = 0.1
    """The latest fraction of the kept requests (by ts) is held out; none of them is used for training."""
    holdout_max: int = 2000
    """At most this many hold-out requests are written (a uniform sample of the held-out window)."""
    hard_by: str = "served"
    """What "hard" ranks by: `served`, the share of the output the served stack drafted and the target
    accepted (suffix index and draft together: draftwheel.mining.residual), or `draft`, the draft model's own
    acceptance rate."""
    hard_quantile: float = 0.25
    """Per slice, the requests at the bottom `hard_quantile` of that rate are hard (if hard_threshold is None)."""
    hard_threshold: float | None = None
    """Absolute alternative: requests with acceptance rate <= this are hard (overrides hard_quantile)."""
    max_hard_per_slice: int = 2000
    """Cap on hard (low-acceptance) samples per slice, lowest acceptance first."""
    max_rollback_per_slice: int = 500
    """Cap per slice on extra samples chosen for the deepest rollback (beyond the hard ones)."""
    min_rollback_depth: int = 2
    """A request qualifies as a deep-rollback sample when some step rejected at least this many drafts."""
    uniform_ratio: float = 0.5
    """Per slice, uniform samples of the remaining requests per selected hard/rollback sample (anti-forgetting)."""
    hard_weight: float = 1.0
    """`weight` column of hard and rollback samples in distill/."""
    uniform_weight: float = 1.0
    """`weight` column of uniform samples in distill/."""
    replay_share: float = 0.25
    """Share of the distill mix given to replay of earlier traffic, split evenly over the served slices
    (every slice in the logs, plus `replay_slices`), so a round on one slice keeps the others in training."""
    replay_min_per_slice: int = 8
    """At least this many replay samples per served slice (when its traffic has them)."""
    replay_slices: list[str] = field(default_factory=list)
    """Slices the champion serves besides those in the logs (the flywheel passes the canary set's);
    one with no earlier traffic in the logs is reported under the manifest's `replay.missing`."""
    replay_boost: dict[str, float] = field(default_factory=dict)
    """Per-slice multiplier of the replay quota, e.g. {prose: 3.0} (the flywheel's retry sets it)."""
    replay_weight: float = 1.0
    """`weight` column of replay samples in distill/ (before the shortfall up-weighting)."""
    replay_max_upweight: float = 4.0
    """A slice that has fewer replay samples than its quota gets weight x quota/kept, at most this factor,
    so its share of the loss stays near its share of the mix."""
    max_pairs_per_request: int = 4
    """Preference pairs per request: the first N rejections (each gives prefix, target token, draft token)."""
    near_dup_threshold: float = 0.8
    """Estimated Jaccard similarity (word n-gram MinHash) at or above which two prompts are near-duplicates."""
    minhash_perm: int = 128
    """MinHash permutations (more = more exact, slower)."""
    shingle_words: int = 3
    """Word n-gram size of the MinHash shingles."""
    scrub_pii: bool = True
    """Replace e-mails, phones, card numbers, IPs and secrets with typed placeholders before writing."""
    tokenizer: str | None = None
    """Local tokenizer/model dir of the target: decodes preference tokens, re-tokenises scrubbed text.
    Without it preference/ is empty and scrubbed requests are left out (their token ids would be stale)."""
    quarantine_max_chars: int = 2000
    """Bad lines are stored in quarantine.jsonl cut to this many characters (after scrubbing)."""
    plot: bool = True
    """Write acceptance_by_slice.png (matplotlib, Agg)."""
    seed: int = 0
    """Seed of the uniform samples (hold-out cap and anti-forgetting mix)."""
    workers: int = 0
    """Scan processes (files are split among them); 0 = one per CPU for logs over 256 MiB, else 1."""

    def __post_init__(self) -> None:
        for name in ("since", "until", "focus_after"):
            try:
                parse_time(getattr(self, name))
            except ValueError as exc:
                raise ValueError(f"{name}: not unix seconds or ISO 8601: {getattr(self, name)!r}") from exc
        if self.skip_suffix_served_above is not None and self.skip_suffix_served_above < 1.0:
            raise ValueError(f"skip_suffix_served_above: a mean accepted length, >= 1 or null, "
                             f"got {self.skip_suffix_served_above!r}")
        if not 0.0 <= self.holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction: must be in [0, 1), got {self.holdout_fraction}")
        if self.hard_by not in ("served", "draft"):
            raise ValueError(f"hard_by: must be 'served' or 'draft', got {self.hard_by!r}")
        if not 0.0 < self.hard_quantile <= 1.0:
            raise ValueError(f"hard_quantile: must be in (0, 1], got {self.hard_quantile}")
        if self.hard_threshold is not None and not 0.0 <= self.hard_threshold <= 1.0:
            raise ValueError(f"hard_threshold: must be in [0, 1] or null, got {self.hard_threshold}")
        if not 0.0 < self.near_dup_threshold <= 1.0:
            raise ValueError(f"near_dup_threshold: must be in (0, 1], got {self.near_dup_threshold}")
        for name in ("holdout_max", "max_hard_per_slice", "max_rollback_per_slice", "max_pairs_per_request", "workers"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        for name in ("min_rollback_depth", "minhash_perm", "shingle_words", "quarantine_max_chars"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: must be >= 1, got {getattr(self, name)}")
        for name in ("uniform_ratio", "hard_weight", "uniform_weight", "replay_weight", "replay_min_per_slice"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if not 0.0 <= self.replay_share < 1.0:
            raise ValueError(f"replay_share: must be in [0, 1), got {self.replay_share}")
        if self.replay_max_upweight < 1.0:
            raise ValueError(f"replay_max_upweight: must be >= 1, got {self.replay_max_upweight}")
        for name, value in self.replay_boost.items():
            if not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"replay_boost.{name}: must be a number >= 0, got {value!r}")

    @property
    def since_ts(self) -> float | None:
        return parse_time(self.since)

    @property
    def until_ts(self) -> float | None:
        return parse_time(self.until)

    @property
    def focus_after_ts(self) -> float | None:
        return parse_time(self.focus_after)
