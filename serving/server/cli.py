"""`draftwheel serve`: load the models, open the acceptance log, run the HTTP server under uvicorn.

Settings come from a `ServeConfig` YAML (`--config`, default configs/serve.yaml), then `key=value`
overrides (`--set` or bare), then the explicit flags (`--k`, `--dtype`, `--served-model-name`, ..., each
the ServeConfig field of that name; `bench` reads the same settings through `load_serve_config`). An
empty API key (`--api-key "$KEY"` with KEY unset, or an empty $DRAFTWHEEL_API_KEY) is a config error,
never an open server. Before loading any model the log dir is created if missing and opened for writing
(refused if that fails); a model that cannot be loaded is one line naming its setting and path or URI
(exit code 2, no traceback). On SIGINT/SIGTERM uvicorn drains in-flight requests for at most
`drain_timeout_s`, then cuts the rest. When the draft is a registry URI (`models:/NAME@ALIAS`), a
`draftwheel.serving.server.reload.DraftWatcher` swaps in the new draft whenever the alias moves. With `suffix_tier` or
`router` on, `draftwheel.serving.server.serving_state.attach_tier` builds the suffix index from the log dir and the router,
and a saver writes their state under $DRAFTWHEEL_HOME/serving. On shutdown the watcher and saver are
stopped and the log is fsynced and closed. Heavy imports happen inside the command function so
`draftwheel --help` stays fast; the HTTP API itself lives in `draftwheel.serving.server.app`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftwheel.cli_help import add_log_dir, examples
from draftwheel.config import ConfigError, SHIPPED_CONFIGS, add_override_arguments
from draftwheel.registry_names import URI_PREFIX
from draftwheel.serving.server.cli_flags import (TARGET_DEFAULT_HELP, add_device, add_dtype, add_k, add_min_path_prob,
                                                add_served_model_name)

log = logging.getLogger(__name__)

DEFAULT_CONFIG = SHIPPED_CONFIGS / "serve.yaml"
API_KEY_ENV = "DRAFTWHEEL_API_KEY"


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve", help="OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions, /metrics, /healthz)",
        description="Serve the target with speculative decoding over an OpenAI-compatible HTTP API, writing "
                    "one acceptance record per request to the log dir. Settings: the ServeConfig YAML, then "
                    "overrides (--set KEY=VALUE or bare KEY=VALUE), then the flags.",
        **examples("draftwheel serve --port 8000 --served-model-name smollm2",
                   "draftwheel serve --k 5 --min-path-prob 0.15 --dtype bfloat16",
                   "draftwheel serve --config configs/serve.yaml --set router=true suffix_tier=true",
                   "draftwheel serve --no-draft --medusa heads/ --log-dir /tmp/draftwheel-logs"))
    add_config_argument(parser)
    add_override_arguments(parser, "k=6")
    parser.add_argument("--target", help=TARGET_DEFAULT_HELP)
    parser.add_argument("--draft", help="draft model: dir, hub id or models:/NAME@ALIAS (hot-reloaded)")
    parser.add_argument("--no-draft", action="store_true", help="serve without a draft (plain decoding)")
    parser.add_argument("--medusa", help="Medusa heads dir (with --no-draft)")
    add_k(parser, None)
    add_min_path_prob(parser, None)
    add_dtype(parser, None)
    add_device(parser, None)
    add_served_model_name(parser)
    parser.add_argument("--host", help="bind address")
    parser.add_argument("--port", type=int, help="TCP port")
    add_log_dir(parser)
    parser.add_argument("--api-key", help=f"require 'Authorization: Bearer KEY' on /v1/* (or set ${API_KEY_ENV})")
    parser.set_defaults(func=_serve_command)


def add_config_argument(parser: argparse.ArgumentParser) -> None:
    """`--config FILE`: a ServeConfig YAML (serve, and bench, which measures what serve runs)."""
    parser.add_argument("--config", type=Path, default=None, metavar="FILE",
                        help="ServeConfig YAML (default: configs/serve.yaml when it exists)")


def load_serve_config(path: Path | None, overrides: list[str]) -> Any:
    """ServeConfig from `path` (default: configs/serve.yaml when it exists) and `key=value` overrides."""
    from draftwheel.config import load_config
    from draftwheel.serving.server.serve_config import ServeConfig

    path = path if path is not None else (DEFAULT_CONFIG if DEFAULT_CONFIG.is_file() else None)
    try:
        return load_config(ServeConfig, path, overrides)
    except ConfigError:
        raise
    except ValueError as exc:  # ServeConfig.__post_init__ names the field
        raise ConfigError(f"{path or 'overrides'}: {exc}") from exc


def with_flags(config: Any, flags: dict[str, Any]) -> Any:
    """`config` with every flag that was given (not None) replacing its field; a refused value is a ConfigError."""
    try:
        return dataclasses.replace(config, **{name: value for name, value in flags.items() if value is not None})
    except ValueError as exc:
        raise ConfigError(f"command line: {exc}") from exc


def build_config(args: argparse.Namespace) -> Any:
    """ServeConfig from the YAML, the overrides, the environment's API key, then the flags."""
    config = load_serve_config(args.config, args.overrides)
    flags = {"target": args.target, "draft": args.draft, "medusa": args.medusa, "host": args.host,
             "port": args.port, "log_dir": args.log_dir, "k": args.k, "min_path_prob": args.min_path_prob,
             "dtype": args.dtype, "device": args.device, "served_model_name": args.served_model_name,
             # the flag wins, even empty (then refused); the environment fills in a key the config lacks
             "api_key": args.api_key if args.api_key is not None else
             (None if config.api_key else os.environ.get(API_KEY_ENV))}
    config = with_flags(config, flags)
    return dataclasses.replace(config, draft=None) if args.no_draft else config


def _start_watcher(engine: Any, config: Any) -> Any:
    """A started DraftWatcher when the draft comes from the registry, else None."""
    if not (config.draft or "").startswith(URI_PREFIX):
        return None
    from draftwheel.serving.server.reload import DraftWatcher

    watcher = DraftWatcher(engine, config.draft, config.reload_poll_s)
    watcher.start()
    return watcher


@contextlib.contextmanager
def _setting(label: str) -> Iterator[None]:
    """Turn the ways loading a setting's file or model fails into a one-line `ConfigError` naming it."""
    from draftwheel.tracking import RegistryError
    from draftwheel.serving.engine.reference import ReferenceModelError

    try:
        yield
    except (OSError, ValueError, RegistryError, ReferenceModelError) as exc:
        raise ConfigError(f"{label}: {exc}") from exc


def open_sink(config: Any, metrics: Any = None) -> Any:
    """The acceptance log, its dir created if missing and its active file opened: refused if unwritable."""
    from draftwheel.home import logs_dir
    from draftwheel.serving.engine.sink import JsonlSink

    log_dir = config.log_dir or logs_dir()
    with _setting(f"log_dir {log_dir}: cannot write the acceptance log there"):
        sink = JsonlSink(log_dir, max_bytes=config.log_max_bytes, flush_every=config.log_flush_every,
                         compress=config.log_compress, metrics=metrics)
        try:
            sink.check_writable()
        except OSError:
            sink.close()
            raise
    return sink


def _load_engine(config: Any, sink: Any, metrics: Any) -> Any:
    """The engine: target (+ Medusa heads), then the draft swapped in, each failure naming its setting."""
    from draftwheel.serving.loading import engine_from_specs, load_model, resolve_target
    from draftwheel.serving.engine.precision import resolve_device, resolve_dtype

    target = config.target
    if target is None:
        with _setting("target (the one the champion was trained for, else the reference model)"):
            target = resolve_target(None, config.draft)
    label = f"target {target}" + (f" / medusa {config.medusa}" if config.medusa else "")
    device = resolve_device(config.device)
    with _setting(label):
        engine = engine_from_specs(target, None, config.medusa, device=device, sink=sink, metrics=metrics,
                                   dtype=resolve_dtype(config.dtype, device), **config.engine_settings())
    if config.draft:
        with _setting(f"draft {config.draft}"):
            engine.swap_draft(load_model(config.draft, device))  # what Engine(target, draft) checks
    return engine


def open_engine(config: Any) -> tuple[Any, Any]:
    """(engine, sink) for `config`: log open and writable, models loaded, metrics attached."""
    from draftwheel.serving.server.metrics import Metrics

    metrics = Metrics()
    sink = open_sink(config, metrics)
    try:
        engine = _load_engine(config, sink, metrics)
    except BaseException:
        sink.close()
        raise
    return engine, sink


def serve(config: Any) -> None:
    """Run the server until interrupted; always stop the watcher and close the log."""
    import uvicorn

    from draftwheel.serving.server.app import create_app
    from draftwheel.serving.server.serving_state import attach_tier

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if threading.current_thread() is threading.main_thread():
        # uvicorn re-raises the signal it drained on; SIGTERM's default action would kill the process
        # before the `finally` below fsyncs and closes the log. As KeyboardInterrupt, uvicorn.run returns.
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    engine, sink = open_engine(config)
    watcher = saver = None
    try:
        with _setting(f"suffix_tier/router (log_dir {sink.log_dir})"):
            saver = attach_tier(engine, config, sink.log_dir)
        if saver is not None:
            saver.start()
        watcher = _start_watcher(engine, config)
        log.info("serving target=%s draft=%s on http://%s:%d (logs: %s)", engine.target.model_id.name,
                 engine.draft.model_id.name if engine.draft else None, config.host, config.port, sink.log_dir)
        uvicorn.run(create_app(engine, config, watcher), host=config.host, port=config.port, log_level="info",
                    timeout_graceful_shutdown=config.drain_timeout_s)
    finally:
        if watcher is not None:
            watcher.stop()
        if saver is not None:
            saver.stop()
        sink.close()


def _serve_command(args: argparse.Namespace) -> int:
    serve(build_config(args))
    return 0
