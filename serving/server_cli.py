"""`draftwheel serve`: load the models, open the acceptance log, run the HTTP server under uvicorn.

Settings come from a `ServeConfig` YAML (`--config`, default configs/serve.yaml), then `--set k=v`
overrides, then the explicit flags. When the draft is a registry URI (`models:/NAME@ALIAS`), a
`serving.reload.DraftWatcher` swaps in the new draft whenever the alias moves. On shutdown the watcher
is stopped and the log is fsynced and closed. Heavy imports happen inside the command function so
`draftwheel --help` stays fast; the HTTP API itself lives in `serving.server`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "serve.yaml"
API_KEY_ENV = "DRAFTWHEEL_API_KEY"
REGISTRY_PREFIX = "models:/"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics, /healthz)",
        description="Serve the target with speculative decoding over an OpenAI-compatible HTTP API, writing "
                    "one acceptance record per request to the log dir.")
    parser.add_argument("--config", type=Path, default=None,
                        help=f"ServeConfig YAML (default: {DEFAULT_CONFIG} when it exists)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override one config field (repeatable), e.g. --set k=6")
    parser.add_argument("--target", help="target model: dir, hub id or models:/NAME@ALIAS "
                                         "(default: the reference target in $DRAFTWHEEL_HOME/models)")
    parser.add_argument("--draft", help="draft model: dir, hub id or models:/NAME@ALIAS (hot-reloaded)")
    parser.add_argument("--no-draft", action="store_true", help="serve without a draft (plain decoding)")
    parser.add_argument("--medusa", help="Medusa heads dir (with --no-draft)")
    parser.add_argument("--host", help="bind address")
    parser.add_argument("--port", type=int, help="TCP port")
    parser.add_argument("--log-dir", help="acceptance log dir (default: $DRAFTWHEEL_HOME/logs)")
    parser.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on /v1/* (or set ${API_KEY_ENV})")
    parser.set_defaults(func=_serve_command)


def build_config(args: argparse.Namespace) -> Any:
    """ServeConfig from the YAML, `--set` overrides, the environment's API key, then the flags."""
    from draftwheel.config import ConfigError, load_config
    from serving.server import ServeConfig

    path = args.config if args.config is not None else (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    try:
        config = load_config(ServeConfig, path, args.overrides)
    except ConfigError:
        raise
    except ValueError as exc:  # ServeConfig.__post_init__ names the field
        raise ConfigError(f"{path or 'overrides'}: {exc}") from exc
    flags = {"target": args.target, "draft": args.draft, "medusa": args.medusa, "host": args.host,
             "port": args.port, "log_dir": args.log_dir,
             # the flag wins; the environment only fills in a key the config does not set
             "api_key": args.api_key or (None if config.api_key else os.environ.get(API_KEY_ENV) or None)}
    changes = {name: value for name, value in flags.items() if value is not None}
    if args.no_draft:
        changes["draft"] = None
    try:
        return dataclasses.replace(config, **changes)
    except ValueError as exc:
        raise ConfigError(f"command line: {exc}") from exc


def _start_watcher(engine: Any, config: Any) -> Any:
    """A started DraftWatcher when the draft comes from the registry, else None."""
    if not (config.draft or "").startswith(REGISTRY_PREFIX):
        return None
    from serving.reload import DraftWatcher

    watcher = DraftWatcher(engine, config.draft, config.reload_poll_s)
    watcher.start()
    return watcher


def open_engine(config: Any) -> tuple[Any, Any]:
    """(engine, sink) for `config`: models loaded, metrics attached, log open."""
    from draftwheel.home import logs_dir, models_dir
    from serving.engine import Engine
    from serving.metrics import Metrics
    from serving.sink import JsonlSink

    target = config.target
    if target is None:
        from serving.reference import ensure_reference_target

        target = str(ensure_reference_target(models_dir()))
    metrics = Metrics()
    sink = JsonlSink(config.log_dir or logs_dir(), max_bytes=config.log_max_bytes,
                     flush_every=config.log_flush_every, compress=config.log_compress, metrics=metrics)
    try:
        engine = Engine.from_paths(target, config.draft, config.medusa, device=config.device, sink=sink,
                                   metrics=metrics)
    except BaseException:
        sink.close()
        raise
    return engine, sink


def serve(config: Any) -> None:
    """Run the server until interrupted; always stop the watcher and close the log."""
    import uvicorn

    from serving.server import create_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine, sink = open_engine(config)
    watcher = None
    try:
        watcher = _start_watcher(engine, config)
        log.info("serving target=%s draft=%s on http://%s:%d (logs: %s)", engine.target.model_id.name,
                 engine.draft.model_id.name if engine.draft else None, config.host, config.port, sink.log_dir)
        uvicorn.run(create_app(engine, config, watcher), host=config.host, port=config.port, log_level="info")
    finally:
        if watcher is not None:
            watcher.stop()
        sink.close()


def _serve_command(args: argparse.Namespace) -> int:
    serve(build_config(args))
    return 0
