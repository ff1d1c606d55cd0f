"""A LinUCB router: per request, choose how to speculate from the request's context. Off by default.

Arms are ways to decode one request: no speculation, the neural draft at k in {2, 4}, the suffix index,
the hybrid. Each arm a keeps a ridge regression of reward on the context features x (disjoint LinUCB,
Li et al. 2010): A_a = lambda*I + sum x x^T, b_a = sum r x, theta_a = A_a^-1 b_a, and the router picks
argmax_a theta_a.x + alpha * sqrt(x^T A_a^-1 x) over the arms the engine can serve (ties: the first
arm), after trying each of them once. The reward is the request's measured tokens/s divided by `reward_scale` (so alpha's scale does
not depend on the machine). Features (`features`): a bias, the slice hashed into `slice_buckets`
one-hot buckets, log prompt length, the suffix index's match length for the prompt, and the recent
acceptance rate, all scaled to about [0, 1].

The state is small (per arm a d x d matrix and a d vector) and round-trips through JSON with
`to_json`/`from_json`; it names the champion draft it learnt with, and `load_state` starts fresh when
the champion changed. Pure Python/NumPy: no torch, no engine; the caller measures and reports rewards.
"""

from __future__ import annotations

import json
import math
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

ARMS: dict[str, tuple[str, int]] = {  # arm -> (engine mode, k)
    "none": ("autoregressive", 0),
    "draft_k2": ("draft", 2),
    "draft_k4": ("draft", 4),
    "suffix": ("suffix", 0),
    "hybrid": ("hybrid", 4),
}


@dataclass
class RouterConfig:
    alpha: float = 1.0
    """Exploration weight of the confidence bonus."""
    ridge: float = 1.0
    """lambda: the prior precision of each arm's regression."""
    reward_scale: float = 20.0
    """Tokens/s that count as reward 1.0."""
    slice_buckets: int = 8
    """Slices are hashed into this many one-hot features."""
    arms: list[str] = field(default_factory=lambda: list(ARMS))

    def __post_init__(self) -> None:
        if self.alpha < 0:
            raise ValueError(f"alpha: must be >= 0, got {self.alpha!r}")
        if self.ridge <= 0:
            raise ValueError(f"ridge: must be > 0, got {self.ridge!r}")
        if self.reward_scale <= 0:
            raise ValueError(f"reward_scale: must be > 0, got {self.reward_scale!r}")
        if self.slice_buckets < 1:
            raise ValueError(f"slice_buckets: must be >= 1, got {self.slice_buckets!r}")
        unknown = [arm for arm in self.arms if arm not in ARMS]
        if unknown or not self.arms:
            raise ValueError(f"arms: must be a non-empty subset of {', '.join(ARMS)}, got {self.arms!r}")

    @property
    def dims(self) -> int:
        return 4 + self.slice_buckets


def features(config: RouterConfig, slice: str, prompt_tokens: int, match_len: int,
             recent_acceptance: float) -> np.ndarray:
    """The context vector x[d] of one request."""
    x = np.zeros(config.dims)
    x[0] = 1.0
    x[1 + zlib.crc32(slice.encode()) % config.slice_buckets] = 1.0  # crc32: stable across processes
    x[-3] = math.log1p(prompt_tokens) / 8.0
    x[-2] = min(match_len, 32) / 32.0
    x[-1] = min(max(recent_acceptance, 0.0), 1.0)
    return x


class Router:
    def __init__(self, config: RouterConfig | None = None, champion: str = ""):
        self.config = config or RouterConfig()
        self.champion = champion
        d = self.config.dims
        self.a = {arm: np.eye(d) * self.config.ridge for arm in self.config.arms}  # arm -> A[d, d]
        self.b = {arm: np.zeros(d) for arm in self.config.arms}  # arm -> b[d]
        self.pulls = dict.fromkeys(self.config.arms, 0)

    def scores(self, x: np.ndarray, explore: bool = True) -> dict[str, float]:
        """Upper confidence bound of each arm's reward at x (the estimate alone without `explore`)."""
        alpha = self.config.alpha if explore else 0.0
        out = {}
        for arm in self.config.arms:
            a_inv = np.linalg.inv(self.a[arm])  # [d, d]
            theta = a_inv @ self.b[arm]  # [d]
            out[arm] = float(theta @ x + alpha * math.sqrt(float(x @ a_inv @ x)))
        return out

    def choose(self, x: np.ndarray, available: list[str] | None = None, explore: bool = True) -> str:
        """The arm to use for a request with features x, among `available` (default: all); without
        `explore`, the arm with the best estimate (untried arms still first)."""
        allowed = [arm for arm in self.config.arms if available is None or arm in available]
        if not allowed:
            raise ValueError(f"available: none of {available!r} is an arm of this router")
        untried = [arm for arm in allowed if self.pulls[arm] == 0]
        if untried:  # rewards are all positive: an untried arm's bonus alone could never beat a tried one
            return untried[0]
        scores = self.scores(x, explore)
        return max(allowed, key=lambda arm: scores[arm])

    def update(self, arm: str, x: np.ndarray, tokens_per_s: float) -> None:
        """Learn from one finished request that `arm` served at `tokens_per_s`."""
        reward = tokens_per_s / self.config.reward_scale
        self.a[arm] += np.outer(x, x)
        self.b[arm] += reward * x
        self.pulls[arm] += 1

    def to_json(self) -> str:
        return json.dumps({"config": asdict(self.config), "champion": self.champion, "pulls": self.pulls,
                           "a": {arm: m.tolist() for arm, m in self.a.items()},
                           "b": {arm: v.tolist() for arm, v in self.b.items()}})

    @classmethod
    def from_json(cls, text: str) -> Router:
        data = json.loads(text)
        router = cls(RouterConfig(**data["config"]), champion=data["champion"])
        for arm in router.config.arms:
            router.a[arm] = np.array(data["a"][arm], dtype=float)
            router.b[arm] = np.array(data["b"][arm], dtype=float)
            router.pulls[arm] = int(data["pulls"][arm])
        return router

    def save(self, path: str | Path) -> None:
        """Write the state atomically (temporary file, then rename)."""
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(self.to_json())
        tmp.replace(path)


def load_state(path: str | Path, champion: str, config: RouterConfig | None = None) -> Router:
    """The saved router if it learnt with this champion, else a fresh one (the champion changed, or
    there is no saved state yet)."""
    path = Path(path)
    if path.is_file():
        router = Router.from_json(path.read_text())
        if router.champion == champion:
            return router
    return Router(config, champion=champion)
