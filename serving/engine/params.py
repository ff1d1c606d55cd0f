"""Per-request sampling parameters of the serving engine.

`SamplingParams` is a plain typed dataclass (also loadable with `draftwheel.config.load_config`).
It validates its own fields and does nothing else: logits warping lives in `draftwheel.serving.engine.sampling`.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SamplingParams:
    max_new_tokens: int = 64
    """Upper bound on generated tokens (finish_reason "length" when reached)."""
    temperature: float = 0.0
    """0 means greedy (argmax); > 0 samples from softmax(logits / temperature)."""
    top_p: float = 1.0
    """Nucleus sampling: keep the smallest set of tokens whose probability mass reaches top_p (1 = off)."""
    top_k: int = 0
    """Keep only the top_k most likely tokens (0 = off)."""
    seed: int | None = None
    """Seed of the request's own torch.Generator; None draws a fresh seed."""
    k: int = 4
    """Draft tokens per verification step (the maximum when adaptive_k is on)."""
    adaptive_k: bool = False
    """Choose k per step from the running acceptance estimate and the measured draft/target cost."""
    stop: list[str] = field(default_factory=list)
    """Stop strings: generation ends when the output contains one; the output is cut before it."""

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens: must be an int >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature: must be in [0, 100], got {self.temperature!r}")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {self.top_p!r}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k: must be an int >= 0, got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed: must be an int or None, got {self.seed!r}")
        if isinstance(self.k, bool) or not isinstance(self.k, int) or not 1 <= self.k <= 32:
            raise ValueError(f"k: must be an int in 1..32, got {self.k!r}")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            raise ValueError(f"stop: must be a list of non-empty strings, got {self.stop!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
