"""The serving state under the state dir: the suffix index's stats and the router's state, as JSON.

`draftwheel serve` keeps, under `$DRAFTWHEEL_HOME/serving/` (`serving_dir()`):
- `suffix_stats.json`: the suffix index's `stats()` (size, hit rate) with the target and the time
  written; `draftwheel status` reads it with `read_suffix_stats` (None when the server never wrote one);
- `router.json`: the router's LinUCB state (`draftwheel.serving.engine.routing.RequestRouter.save`).
`StateSaver` writes both on a background thread every `every_s` seconds and once more on `stop()`.
Writes are atomic (temporary file, then rename), so a reader never sees half a file. `attach_tier`
gives an engine what a `ServeConfig` asks for: the suffix index (from the newest logs, bounded) and the router.

Not here: the index (draftwheel.serving.engine.suffix), the bandit (draftwheel.serving.engine.router, draftwheel.serving.engine.routing), the HTTP server.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from draftwheel.home import state_dir

log = logging.getLogger(__name__)

SUFFIX_STATS_FILE = "suffix_stats.json"
ROUTER_FILE = "router.json"


def serving_dir(root: str | Path | None = None) -> Path:
    """Where the server keeps its state: `<state dir>/serving` (not created)."""
    return Path(root) if root is not None else state_dir() / "serving"


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)


def write_suffix_stats(index: Any, root: str | Path | None = None) -> Path:
    """Write the index's stats (`SuffixIndex.stats()`), its target and the time to suffix_stats.json."""
    path = serving_dir(root) / SUFFIX_STATS_FILE
    write_json(path, {"target": index.target, "written": time.time(), **index.stats()})
    return path


def read_suffix_stats(root: str | Path | None = None) -> dict[str, Any] | None:
    """The last stats the server wrote, or None when there are none (or the file is unreadable)."""
    path = serving_dir(root) / SUFFIX_STATS_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class StateSaver:
    """Saves the index stats and the router state every `every_s` seconds and on `stop()`."""

    def __init__(self, index: Any = None, router: Any = None, root: str | Path | None = None,
                 every_s: float = 60.0):
        if every_s <= 0:
            raise ValueError(f"every_s: must be > 0, got {every_s!r}")
        self.index, self.router, self.root, self.every_s = index, router, root, every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def save(self) -> None:
        """One save of both; a failure is logged, never raised (serving goes on)."""
        try:
            if self.index is not None:
                write_suffix_stats(self.index, self.root)
            if self.router is not None:
                self.router.save()
        except Exception:  # noqa: BLE001 - state files must not stop serving
            log.exception("saving the serving state under %s failed", serving_dir(self.root))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.save()

    def start(self) -> StateSaver:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="draftwheel-state-saver", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
            self._thread = None
        self.save()


def startup_index(config: Any, log_dir: str | Path, model_id: Any) -> Any:
    """The suffix index serving starts with under `config` (a ServeConfig): built from `log_dir`'s records of
    this target (`model_id`), the newest `suffix_startup_max_bytes` of files, within its size bounds."""
    from draftwheel.serving.engine.suffix import SuffixConfig, SuffixIndex, target_key

    started = time.perf_counter()
    suffix = SuffixConfig(max_requests=config.suffix_max_requests, max_tokens=config.suffix_max_tokens)
    index = SuffixIndex.from_logs(log_dir, target_key(model_id), suffix, max_bytes=config.suffix_startup_max_bytes)
    log.info("suffix index: %d requests, %d tokens from %s in %.1f s", index.requests, index.tokens, log_dir,
             time.perf_counter() - started)
    return index


def attach_tier(engine: Any, config: Any, log_dir: str | Path, root: str | Path | None = None) -> StateSaver | None:
    """Give `engine` the suffix index and router `config` (a ServeConfig) turns on; a saver (not yet
    started) for their state, or None when both are off. The index is built from `log_dir` (records of
    this target only, the newest `suffix_startup_max_bytes` of files) and written once to the stats file."""
    from draftwheel.serving.engine.routing import RequestRouter

    if not (config.suffix_tier or config.router):
        return None
    if config.suffix_tier:
        engine.suffix_index = startup_index(config, log_dir, engine.target.model_id)
    if config.router:
        engine.router = RequestRouter(state_path=serving_dir(root) / ROUTER_FILE)
    saver = StateSaver(engine.suffix_index, engine.router, root, config.state_save_s)
    saver.save()
    return saver
