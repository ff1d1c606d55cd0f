"""Hot reload of the draft model when a registry alias moves (`models:/NAME@ALIAS`).

`DraftWatcher` polls the alias on a background thread. When it points to a new version, the watcher
downloads and verifies it (`draftwheel.tracking.resolve_model_uri`: safetensors only, sha256-checked),
checks that the version was trained for the engine's target (`draftwheel.registry_names.trained_for`: its
`target_sha256` tag must be there and equal the loaded target's weights hash), loads it, and calls
`engine.swap_draft`. Requests already running
finish on the draft they started with (the engine reads its draft once per request).

Anything that goes wrong leaves the current draft serving: the reason is logged and kept in
`last_error`. A transient registry failure is retried at the next poll; a version refused for its
content (wrong target, missing/corrupt/pickle artifacts, incompatible vocabulary) is not retried while
the alias stays on it. The watcher does not move aliases itself.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from draftwheel.registry_names import not_trained_for, trained_for, version_uri
from draftwheel.tracking import ArtifactError, RegistryError, get_alias_version, parse_model_uri, resolve_model_uri
from draftwheel.serving.engine.models import IncompatibleModelsError, LoadedModel, check_compatible
from draftwheel.serving.loading import load_model

log = logging.getLogger(__name__)


class TargetMismatchError(RuntimeError):
    """A registry draft was trained for a different target than the one being served."""


class DraftWatcher:
    def __init__(self, engine: Any, uri: str, poll_s: float = 5.0, tracking_uri: str | None = None):
        self.name, _, self.alias = parse_model_uri(uri)
        if self.alias is None:
            raise ValueError(f"uri: {uri!r} names a fixed version; the watcher follows an alias (models:/NAME@ALIAS)")
        if poll_s <= 0:
            raise ValueError(f"poll_s: must be > 0, got {poll_s!r}")
        self.engine = engine
        self.uri = uri
        self.poll_s = poll_s
        self.tracking_uri = tracking_uri
        draft = engine.draft
        self.current_version: str | None = draft.model_id.version if draft is not None else None
        self.last_error: str | None = None
        self.refused: dict[str, str] = {}  # version -> why; not retried while the alias stays on it
        self.swaps = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def poll_once(self) -> bool:
        """Check the alias once; swap the draft if it moved to a usable version. True if swapped."""
        try:
            version = get_alias_version(self.alias, self.name, self.tracking_uri)
        except RegistryError as exc:
            return self._keep(f"registry unreachable or failing, keeping version {self.current_version}: {exc}")
        if version is None:
            return self._keep(f"alias {self.alias!r} of {self.name} is not set; keeping version {self.current_version}")
        if version in self.refused:
            return False
        self.refused.clear()  # the alias moved on: a refused version gets a fresh try if it comes back
        if version == self.current_version:
            self.last_error = None
            return False
        try:
            loaded = self._load(version)
        except ArtifactError as exc:  # before RegistryError, its base: bad content is not transient
            return self._refuse(version, exc)
        except RegistryError as exc:  # the registry itself failed: try again at the next poll
            return self._keep(f"could not fetch version {version}, keeping {self.current_version}: {exc}")
        except (TargetMismatchError, IncompatibleModelsError, OSError, ValueError) as exc:
            return self._refuse(version, exc)
        self.engine.swap_draft(loaded)
        log.info("draft %s@%s: swapped version %s -> %s", self.name, self.alias, self.current_version, version)
        self.current_version, self.last_error = version, None
        self.swaps += 1
        return True

    def _load(self, version: str) -> LoadedModel:
        local_dir, version, tags = resolve_model_uri(version_uri(version, self.name), self.tracking_uri)
        # A served target without a weights hash ("") matches no version: which target a draft suits is
        # unknowable then, and guessing would risk a draft trained for other weights.
        serving_sha = self.engine.target.model_id.sha256 or ""
        if not trained_for(tags, serving_sha):
            raise TargetMismatchError(f"version {version}: {not_trained_for(tags, serving_sha, 'the served target')}")
        param = next(self.engine.target.model.parameters())
        loaded = load_model(local_dir, device=str(param.device), dtype=param.dtype)
        check_compatible(self.engine.target, loaded)  # refuse here rather than fail inside swap_draft
        model_id = dataclasses.replace(loaded.model_id, name=self.name, version=version)
        return dataclasses.replace(loaded, model_id=model_id, tags=tags)

    def _keep(self, reason: str) -> bool:
        if reason != self.last_error:  # one log line per distinct problem, not one per poll
            log.warning("draft %s@%s: %s", self.name, self.alias, reason)
        self.last_error = reason
        return False

    def _refuse(self, version: str, exc: Exception) -> bool:
        reason = f"refused version {version} ({type(exc).__name__}: {exc}); keeping version {self.current_version}"
        self.refused[version] = reason
        return self._keep(reason)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.poll_once()
            except Exception as exc:  # noqa: BLE001 - the watcher must outlive any one bad poll
                self._keep(f"unexpected error while polling: {type(exc).__name__}: {exc}")

    def start(self) -> "DraftWatcher":
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name=f"draft-watcher-{self.alias}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float | None = 30.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> "DraftWatcher":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
