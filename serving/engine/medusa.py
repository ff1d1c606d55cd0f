"""Medusa-1 heads: extra next-next-token predictors on top of a frozen target model.

Each head is a small stack of residual blocks (`x + SiLU(Wx + b)`) followed by the target's own,
shared and frozen `lm_head`. Head `i` (0-based) reads the target's final hidden state at position
`t` (the normalised hidden state that feeds the target's `lm_head`, i.e. `hidden_states[-1]` of a
Hugging Face causal LM) and predicts the token at position `t + i + 2`; the target itself already
predicts `t + 1`. The blocks' linear layers start at zero, so every block is the identity at
initialisation and every head starts out predicting what the target predicts for `t + 1`.

This module holds the heads and their save/load format (`medusa_heads.safetensors` +
`medusa_config.json`); it does not train them (`draftwheel.training.medusa_train`) or decode with them (the
Engine's `medusa` mode). Only the blocks are saved: the `lm_head` always comes from the target.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

WEIGHTS_FILE = "medusa_heads.safetensors"
CONFIG_FILE = "medusa_config.json"


class ResBlock(nn.Module):
    """`x + SiLU(Wx + b)` with `W`, `b` zero-initialised, so the block starts as the identity."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, hidden_size)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)
        self.act = nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.act(self.linear(x))


class MedusaHeads(nn.Module):
    """`n_heads` residual-block heads sharing the target's frozen `lm_head`.

    `forward(hidden[B, T, H]) -> logits[n_heads, B, T, V]`; head `i` predicts token `t + i + 2`.
    """

    def __init__(self, hidden_size: int, n_heads: int, lm_head: nn.Module, n_layers: int = 1,
                 target_sha256: str | None = None):
        super().__init__()
        if n_heads < 1:
            raise ValueError(f"n_heads must be >= 1, got {n_heads}")
        if n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {n_layers}")
        self.hidden_size = hidden_size
        self.n_heads = n_heads
        self.n_layers = n_layers
        self.target_sha256 = target_sha256
        # One independent module per head (a `[block] * n` list would share a single set of weights).
        self.blocks = nn.ModuleList(
            nn.Sequential(*(ResBlock(hidden_size) for _ in range(n_layers))) for _ in range(n_heads)
        )
        self.lm_head = lm_head
        for param in self.lm_head.parameters():
            param.requires_grad_(False)

    @classmethod
    def for_target(cls, target_model: nn.Module, n_heads: int, n_layers: int = 1,
                   target_sha256: str | None = None) -> "MedusaHeads":
        """Fresh (identity-initialised) heads sized for `target_model`, sharing its `lm_head`."""
        heads = cls(target_model.config.hidden_size, n_heads, target_model.get_output_embeddings(),
                    n_layers=n_layers, target_sha256=target_sha256)
        weight = heads.lm_head.weight
        return heads.to(device=weight.device, dtype=weight.dtype)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """The heads' own parameters (the shared `lm_head` stays frozen)."""
        return list(self.blocks.parameters())

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden: [B, T, H] -> [n_heads, B, T, V]. The shared LM head (most of the cost: its weight is
        # V x H) runs once over all heads' block outputs stacked, not once per head.
        return self.lm_head(torch.stack([block(hidden) for block in self.blocks]))

    def head_logits(self, index: int, hidden: torch.Tensor) -> torch.Tensor:
        """Logits of head `index` alone: [..., H] -> [..., V] (training computes heads one at a time)."""
        return self.lm_head(self.blocks[index](hidden))

    def config_dict(self) -> dict:
        return {"hidden_size": self.hidden_size, "n_heads": self.n_heads, "n_layers": self.n_layers,
                "target_sha256": self.target_sha256}

    def save(self, path: str | Path) -> Path:
        """Write the blocks' weights (safetensors) and the heads' config (json) into `path`."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = {k: v.detach().contiguous().cpu() for k, v in self.blocks.state_dict().items()}
        save_file(state, str(path / WEIGHTS_FILE))
        (path / CONFIG_FILE).write_text(json.dumps(self.config_dict(), indent=2))
        return path

    @classmethod
    def load(cls, path: str | Path, target_model: nn.Module) -> "MedusaHeads":
        """Load heads saved by `save`, attached to `target_model`'s `lm_head`.

        Raises `ValueError` when the heads were trained for a different hidden size.
        """
        path = Path(path)
        config = json.loads((path / CONFIG_FILE).read_text())
        hidden = target_model.config.hidden_size
        if config["hidden_size"] != hidden:
            raise ValueError(f"medusa heads at {path} have hidden_size {config['hidden_size']}, "
                             f"the target has {hidden}")
        heads = cls.for_target(target_model, config["n_heads"], config.get("n_layers", 1),
                               config.get("target_sha256"))
        heads.blocks.load_state_dict(load_file(str(path / WEIGHTS_FILE)))
        return heads.eval()


def is_medusa_dir(path: str | Path) -> bool:
    """True when `path` holds saved Medusa heads."""
    path = Path(path)
    return (path / CONFIG_FILE).is_file() and (path / WEIGHTS_FILE).is_file()
