"""Tiny target/draft models for flow tests, where the better draft is known in advance.

The target is `zero_extended_target(good)`: a deeper model computing exactly `good`'s function, so the
`good` draft is accepted on every token (acceptance 1) while `bad`, a random model of the same shape,
is accepted only by chance. Heads are untied: with tied embeddings a random tiny model just echoes its
last token, and any two such models would agree on everything.
"""

from __future__ import annotations

import random
from pathlib import Path

from draftwheel.serving.testing import build_tokenizer, save_model, tiny_llama, zero_extended_target

WORDS = ("sea sky fox dog poem stack list items read write test class return import print line "
         "question lazy brown quick help today short things").split()


def build_models(root: Path) -> dict[str, Path]:
    """Save target, good and bad model dirs under `root`."""
    tokenizer = build_tokenizer()
    good = tiny_llama(tokenizer, n_layers=1, hidden=64, seed=1, tie_embeddings=False)
    models = {"target": zero_extended_target(good, 3), "good": good,
              "bad": tiny_llama(tokenizer, n_layers=1, hidden=64, seed=7, tie_embeddings=False)}
    return {name: save_model(model, tokenizer, root / name) for name, model in models.items()}


def register_drafts(dirs: dict[str, Path], names: tuple[str, ...]) -> dict[str, str]:
    """Register the named drafts in the state dir's registry, tagged as trained for `dirs["target"]`."""
    from draftwheel import tracking
    from draftwheel.registry_names import TARGET_SHA_TAG
    from draftwheel.serving.engine.models import weights_sha256

    tags = {TARGET_SHA_TAG: weights_sha256(dirs["target"])}
    return {name: tracking.register_draft(dirs[name], tags) for name in names}


# Two slices that differ in what the target answers: prompts from disjoint word sets.
SLICE_WORDS = {"chat": "sea sky fox dog poem lazy brown quick help today short things question".split(),
               "code": "stack list items read write test class return import print line def".split()}


def slice_salads(name: str, n: int, seed: int = 0) -> list[dict[str, str]]:
    """`n` requests of slice `name`: word salads from that slice's own words (SLICE_WORDS)."""
    rng = random.Random(seed)
    return [{"prompt": " ".join(rng.choice(SLICE_WORDS[name]) for _ in range(8)), "slice": name} for _ in range(n)]


def word_salads(n: int, seed: int = 0) -> list[dict[str, str]]:
    """`n` requests of random word salads, alternating chat/code: distinct prompts that survive near-dedupe."""
    rng = random.Random(seed)
    return [{"prompt": " ".join(rng.choice(WORDS) for _ in range(8)), "slice": ("chat", "code")[i % 2]}
            for i in range(n)]
