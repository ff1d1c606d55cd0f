"""`draftwheel proxy --upstream URL`: run the logging pass-through (draftwheel.serving.server.proxy) under uvicorn.

Flags only (it reads no config file). Before serving, the log dir is opened for writing (refused if it cannot
be), the target's tokenizer is loaded for chat prompts (`--tokenizer`, default the reference target in the
state dir when it is there; without one, chat exchanges are forwarded but not recorded, and a warning says
so), and `--draft` (a dir or `models:/NAME@ALIAS`) is resolved to the id records carry. Errors are one line
with `draftwheel.exit_codes`' codes. Heavy imports happen inside the command function.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from draftwheel.cli_help import add_log_dir, examples
from draftwheel.exit_codes import fail

log = logging.getLogger(__name__)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "proxy", help="OpenAI-compatible pass-through to vLLM/SGLang/draftwheel serve that logs acceptance records",
        description="Forward /v1/completions, /v1/chat/completions (streamed or not) and /v1/models to --upstream, "
                    "hand the responses back unchanged, and write one acceptance record per request (text, "
                    "slice, and the upstream's metrics.speculative_decoding figures; start vLLM with "
                    "--per-request-spec-decode-metrics summary) to --log-dir for mining. Flags only: it reads no "
                    "config file.",
        **examples("draftwheel proxy --upstream http://127.0.0.1:8000 --port 8001",
                   "draftwheel proxy --upstream http://gpu-box:8000/v1 --tokenizer Qwen/Qwen3-0.6B "
                   "--log-dir /tmp/vllm-logs",
                   "draftwheel proxy --upstream http://127.0.0.1:8000 --draft models:/draftwheel-draft@champion"))
    parser.add_argument("--upstream", required=True, help="base URL of the OpenAI-compatible server")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8001, help="TCP port (default: 8001)")
    add_log_dir(parser, "where to write the acceptance records (default: $DRAFTWHEEL_HOME/logs)")
    parser.add_argument("--tokenizer", help="the target's tokenizer (model dir, hub id or models:/ URI), for chat "
                                            "templates (default: the reference target in the state dir, if present)")
    parser.add_argument("--draft", help="the draft the upstream runs (dir or models:/NAME@ALIAS), recorded as the "
                                        "records' draft_id so the monitor can match them to the champion")
    parser.add_argument("--source", default="", help="the records' source (default: proxy:HOST:PORT of the upstream)")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="longest wait for the upstream (default: 600)")
    parser.set_defaults(func=_proxy_command)


def load_tokenizer(spec: str | None) -> Any:
    """The tokenizer at `spec` (dir, hub id, models:/ URI); None = the reference target's, or None without it."""
    from transformers import AutoTokenizer

    from draftwheel.serving.engine.reference import default_target_dir
    from draftwheel.serving.loading import resolve_spec

    if spec is None:
        if not default_target_dir().is_dir():
            return None
        spec = str(default_target_dir())
    return AutoTokenizer.from_pretrained(resolve_spec(spec))


def draft_model_id(spec: str) -> Any:
    """The id records carry for the draft `spec` names (name, registry version, weights sha256)."""
    from draftwheel.registry_names import URI_PREFIX
    from draftwheel.serving.engine.models import weights_sha256
    from draftwheel.serving.engine.records import ModelId
    from draftwheel.serving.loading import resolve_spec

    if spec.startswith(URI_PREFIX):
        from draftwheel.tracking import parse_model_uri, resolve_model_uri

        local_dir, version, _ = resolve_model_uri(spec)
        return ModelId(parse_model_uri(spec)[0], str(version), weights_sha256(Path(local_dir)))
    path = resolve_spec(spec)
    return ModelId(path.resolve().name, "", weights_sha256(path))


def _proxy_command(args: argparse.Namespace) -> int:
    import uvicorn

    from draftwheel.home import logs_dir
    from draftwheel.serving.engine.sink import JsonlSink
    from draftwheel.serving.server.proxy import ProxyConfig, create_proxy_app
    from draftwheel.tracking import RegistryError

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = ProxyConfig(upstream=args.upstream, host=args.host, port=args.port, log_dir=args.log_dir,
                             source=args.source, timeout_s=args.timeout_s)
        tokenizer = load_tokenizer(args.tokenizer)
        draft_id = draft_model_id(args.draft) if args.draft else None
        sink = JsonlSink(config.log_dir or logs_dir())
    except (ValueError, OSError, RegistryError) as exc:
        return fail("proxy", exc)
    try:
        sink.check_writable()
    except OSError as exc:
        sink.close()
        return fail("proxy", OSError(f"log_dir {sink.log_dir}: cannot write the acceptance log there: {exc}"))
    if tokenizer is None:
        log.warning("no target tokenizer (--tokenizer): chat requests are forwarded but not recorded")
    log.info("proxy http://%s:%d -> %s (records: %s, source %s)", config.host, config.port, config.base_url,
             sink.log_dir, config.record_source)
    try:
        uvicorn.run(create_proxy_app(config, sink, tokenizer, draft_id), host=config.host, port=config.port,
                    log_level="info")
    finally:
        sink.close()
    return 0
