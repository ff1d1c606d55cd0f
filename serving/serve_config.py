"""`ServeConfig`: the settings of `draftwheel serve` (configs/serve.yaml; a test keeps the two equal).

Values are checked in `__post_init__`, each error naming its field. Not here: loading the YAML and the
flag precedence (`serving.server_cli`), using the settings (`serving.server`).
"""

from __future__ import annotations

from dataclasses import dataclass

from draftwheel.registry_names import CHAMPION_URI

MiB = 1024 * 1024


@dataclass
class ServeConfig:
    """`draftwheel serve` settings (configs/serve.yaml); CLI flags override them."""

    host: str = "127.0.0.1"
    port: int = 8000
    target: str | None = None
    """Target model dir, hub id or models:/ URI; None = the reference target in $DRAFTWHEEL_HOME/models."""
    draft: str | None = CHAMPION_URI
    """Draft model (dir, hub id, models:/NAME@ALIAS: reloaded when the alias moves); None = no draft."""
    medusa: str | None = None
    """Medusa heads dir (used when no draft is given)."""
    served_model_name: str | None = None
    """The `model` name clients send; None = the target's name."""
    api_key: str | None = None
    """Bearer key required on /v1/* (None = open; also read from $DRAFTWHEEL_API_KEY by the CLI).
    An empty or blank key is refused: it is how an unset shell variable arrives."""
    log_dir: str | None = None
    """Acceptance log dir, created if missing; the server refuses to start when it cannot write there.
    None = $DRAFTWHEEL_HOME/logs."""
    log_max_bytes: int = 64 * MiB
    log_flush_every: int = 32
    log_compress: bool = False
    k: int = 4
    adaptive_k: bool = False
    default_max_tokens: int = 256
    """max_tokens when the request gives none (clamped to the context left after the prompt)."""
    default_temperature: float = 1.0
    """temperature when the request gives none (OpenAI's default is 1)."""
    max_body_bytes: int = MiB
    """Largest request body accepted (413 above it, before parsing)."""
    max_prompt_chars: int = 100_000
    """Most prompt characters per request (all prompts, or all message texts; 413 above it, before
    tokenising). 100k characters tokenise in ~0.3 s on one core and are well over any served context."""
    drain_timeout_s: float = 30.0
    """On SIGINT/SIGTERM, how long in-flight requests may run before they are cut (and counted in the log)."""
    reload_poll_s: float = 30.0
    device: str = "cpu"

    def __post_init__(self) -> None:
        checks = {"port": 0 <= self.port <= 65535, "log_max_bytes": self.log_max_bytes > 0,
                  "log_flush_every": self.log_flush_every > 0, "k": 1 <= self.k <= 32,
                  "default_max_tokens": self.default_max_tokens >= 1,
                  "default_temperature": self.default_temperature >= 0, "reload_poll_s": self.reload_poll_s > 0,
                  "max_body_bytes": self.max_body_bytes > 0, "max_prompt_chars": self.max_prompt_chars > 0,
                  "drain_timeout_s": self.drain_timeout_s >= 0}
        for name, ok in checks.items():
            if not ok:
                raise ValueError(f"{name}: invalid value {getattr(self, name)!r}")
        if self.api_key is not None and (not self.api_key.strip() or self.api_key != self.api_key.strip()):
            raise ValueError(f"api_key: {self.api_key!r} is empty or has surrounding blanks (use null for no key; "
                             "an unset shell variable passed as --api-key \"$KEY\" arrives as an empty string)")
