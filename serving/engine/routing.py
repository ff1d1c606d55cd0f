"""The router in the engine: per request, `draftwheel.serving.engine.router`'s LinUCB picks the mode and k, then learns.

`RequestRouter.pick` builds the request's features (slice, prompt length, the suffix index's match
length for the prompt, the mean acceptance rate of the last `recent` requests that drafted), keeps only
the arms the engine can serve (a draft model for `draft_k*`/`hybrid`, an `lm` draft for `hybrid`, a
suffix index for `suffix`/`hybrid`) and returns a `Pick`. `learn` rewards the arm with the request's
measured tokens/s. The router learns for one champion draft: when the engine's draft differs from the
one the state names (a hot reload swapped it, or the saved state is of an older champion), the state
starts fresh. `save` writes the JSON state (under the serving state dir, `draftwheel.serving.server.serving_state`);
every method holds one lock, so a saver thread and the engine thread can share the object.

Not here: the bandit's arithmetic (draftwheel.serving.engine.router), decoding, timing (the engine measures tokens/s).
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftwheel.serving.engine.router import ARMS, Router, RouterConfig, features, load_state
from draftwheel.serving.engine.suffix import SuffixIndex


@dataclass(frozen=True)
class Pick:
    arm: str
    mode: str
    k: int
    """Draft length the arm asks for; 0 = the request's own k."""
    x: np.ndarray


def champion_key(draft: Any) -> str:
    """Who the router learns for: the draft's name, version and weights hash ('' without a draft)."""
    if draft is None:
        return ""
    model_id = draft.model_id
    return f"{model_id.name}@{model_id.version or ''}:{model_id.sha256 or ''}"


def available_arms(draft: Any, index: SuffixIndex | None) -> list[str]:
    """The arms an engine with this draft (a LoadedModel or None) and suffix index can serve."""
    needs = {"draft": draft is not None, "suffix": index is not None,
             "hybrid": draft is not None and index is not None}
    return [arm for arm, (mode, _) in ARMS.items() if needs.get(mode, True)]


class RequestRouter:
    def __init__(self, config: RouterConfig | None = None, state_path: str | Path | None = None,
                 recent: int = 16):
        """With `state_path`, the saved state is loaded (when it names the first champion seen) and saved there."""
        self.config = config or RouterConfig()
        self.state_path = Path(state_path) if state_path is not None else None
        self._router: Router | None = None
        self._recent: deque[float] = deque(maxlen=recent)
        self._lock = threading.Lock()

    def _for(self, champion: str) -> Router:
        """The bandit for this champion: the current one, the saved one, or a fresh one."""
        if self._router is None and self.state_path is not None:
            self._router = load_state(self.state_path, champion, self.config)
        if self._router is None or self._router.champion != champion:
            self._router = Router(self.config, champion=champion)
            self._recent.clear()
        return self._router

    def pick(self, draft: Any, index: SuffixIndex | None, slice: str, prompt_ids: list[int]) -> Pick:
        """The arm for one request; raises ValueError when the engine can serve none of the router's arms."""
        match_len = index.propose(prompt_ids, 16).match_len if index is not None else 0
        with self._lock:
            router = self._for(champion_key(draft))
            recent = sum(self._recent) / len(self._recent) if self._recent else 0.5
            x = features(self.config, slice, len(prompt_ids), match_len, recent)
            arm = router.choose(x, available_arms(draft, index))
        mode, k = ARMS[arm]
        return Pick(arm=arm, mode=mode, k=k, x=x)

    def learn(self, pick: Pick, draft: Any, tokens_per_s: float, acceptance_rate: float | None) -> None:
        """Reward `pick` with the request's tokens/s (dropped when the champion changed meanwhile);
        `acceptance_rate` (None when nothing was drafted) feeds the recent-acceptance feature."""
        with self._lock:
            router = self._router
            if router is None or router.champion != champion_key(draft):
                return
            router.update(pick.arm, pick.x, tokens_per_s)
            if acceptance_rate is not None:
                self._recent.append(acceptance_rate)

    @property
    def pulls(self) -> dict[str, int]:
        with self._lock:
            return dict(self._router.pulls) if self._router is not None else {}

    def save(self) -> bool:
        """Write the state to `state_path` (atomically); False when there is nothing to write or no path."""
        with self._lock:
            if self.state_path is None or self._router is None:
                return False
            self.state_path.parent.mkdir(parents=True, exist_ok=True)
            self._router.save(self.state_path)
            return True
