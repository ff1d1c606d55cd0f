"""`draftwheel ingest FILE`: the command line of `draftwheel.mining.ingest` (request/response logs -> records).

Flags only (it reads no config file). Prints the counts as JSON; exit code 0 when at least one record was
written, 2 (`draftwheel.exit_codes.USAGE`) when the file gave none or cannot be read, the log dir cannot
be written, or the tokenizer cannot be loaded. Heavy imports (transformers) happen inside the command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from draftwheel.cli_help import add_log_dir, examples
from draftwheel.exit_codes import USAGE, fail


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "ingest", help="turn request/response logs (e.g. from vLLM) into acceptance records for mining",
        description="Read a JSONL file of {\"request\": OpenAI request, \"response\": OpenAI response or the list of "
                    "its streamed chunks} (vLLM's metrics.speculative_decoding read when present) and write one "
                    "acceptance record per line to --log-dir, as `draftwheel proxy` does; lines that give no record "
                    "are quarantined with their reason and counted. Flags only: it reads no config file.",
        **examples("draftwheel ingest requests.jsonl",
                   "draftwheel ingest vllm-traffic.jsonl.gz --tokenizer Qwen/Qwen3-0.6B --log-dir /tmp/vllm-logs",
                   "draftwheel ingest exchanges.jsonl --source vllm --quarantine /tmp/ingest-bad.jsonl"))
    parser.add_argument("file", type=Path, help="JSONL (or .jsonl.gz) of request/response pairs")
    add_log_dir(parser, "where to write the acceptance records (default: $DRAFTWHEEL_HOME/logs)", type=Path)
    parser.add_argument("--tokenizer", help="the target's tokenizer (model dir, hub id or models:/ URI) that renders "
                                            "chat prompts (default: the reference target in the state dir, if present)")
    parser.add_argument("--source", default="", help="the records' source (default: ingest:FILE NAME)")
    parser.add_argument("--quarantine", type=Path, metavar="FILE",
                        help="where bad lines go (default: $DRAFTWHEEL_HOME/ingest/FILE NAME.quarantine.jsonl)")
    parser.set_defaults(func=_ingest_command)


def _ingest_command(args: argparse.Namespace) -> int:
    from draftwheel.home import logs_dir, state_dir
    from draftwheel.mining.ingest import ingest
    from draftwheel.serving.server.proxy_cli import load_tokenizer
    from draftwheel.tracking import RegistryError

    quarantine = args.quarantine or state_dir() / "ingest" / f"{args.file.name}.quarantine.jsonl"
    try:
        tokenizer = load_tokenizer(args.tokenizer)
        summary = ingest(args.file, args.log_dir or logs_dir(), quarantine, tokenizer, args.source)
    except (ValueError, OSError, RegistryError) as exc:
        return fail("ingest", exc)
    print(json.dumps(summary, indent=2))
    return 0 if summary["records"] else USAGE
