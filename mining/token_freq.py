"""Output-token frequencies of the mined traffic, for the manifest (FR-Spec's signal for a draft vocabulary).

An eagle3 draft proposes over the N most frequent output tokens of its training data
(draftwheel.training.eagle_train); this table shows a user, before any training, how concentrated the new
traffic's outputs are: the top tokens and how much of the training and hold-out outputs the top N of
the training outputs cover, for a few N. Counting only; the trainer picks its vocabulary itself (its
data may be lengthened first) and decides whether to rebuild it.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Iterable

SIZES = (1024, 2048, 4096, 8192)


def coverage(top: set[int], counts: Counter[int]) -> float:
    """Share of the counted tokens that `top` contains."""
    total = sum(counts.values())
    return sum(c for t, c in counts.items() if t in top) / total if total else 0.0


def token_table(train: Counter[int], holdout: Counter[int], sizes: Iterable[int] = SIZES,
                show: int = 20) -> dict[str, Any]:
    """The manifest's `output_tokens` section from the output-token counts of distill/ and holdout/."""
    ranked = [t for t, _ in train.most_common()]
    return {
        "distill_tokens": sum(train.values()), "distill_distinct": len(train),
        "holdout_tokens": sum(holdout.values()),
        "top": [[t, c] for t, c in train.most_common(show)],
        "coverage_of_top_n": {str(n): {"distill": round(coverage(set(ranked[:n]), train), 4),
                                       "holdout": round(coverage(set(ranked[:n]), holdout), 4)} for n in sizes},
    }
