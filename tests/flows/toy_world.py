"""Tiny target/draft models for flow tests, where the better draft is known in advance.

The target is `zero_extended_target(good)`: a deeper model computing exactly `good`'s function, so the
`good` draft is accepted on every token (acceptance 1) while `bad`, a random model of the same shape,
is accepted only by chance. Heads are untied: with tied embeddings a random tiny model just echoes its
last token, and any two such models would agree on everything.
"""

from __future__ import annotations

from pathlib import Path

from serving.toy import build_tokenizer, save_model, tiny_llama, zero_extended_target


def build_models(root: Path) -> dict[str, Path]:
    """Save target, good and bad model dirs under `root`."""
    tokenizer = build_tokenizer()
    good = tiny_llama(tokenizer, n_layers=1, hidden=64, seed=1, tie_embeddings=False)
    models = {"target": zero_extended_target(good, 3), "good": good,
              "bad": tiny_llama(tokenizer, n_layers=1, hidden=64, seed=7, tie_embeddings=False)}
    return {name: save_model(model, tokenizer, root / name) for name, model in models.items()}
