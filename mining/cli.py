"""`draftwheel traffic` and `draftwheel mine`: thin command-line wrappers over the mining package.

Heavy imports (torch, transformers, datasets) happen inside the command functions so that
`draftwheel --help` stays fast. The work itself lives in `draftwheel.mining.replay_workload` and `draftwheel.mining.pipeline`.
Errors are one line; the exit code follows `draftwheel.exit_codes` (2: an input the user can fix, 1: the
run failed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from draftwheel.cli_help import add_deprecated_alias, add_log_dir, examples
from draftwheel.config import SHIPPED_CONFIGS, add_override_arguments
from draftwheel.exit_codes import FAILURE, USAGE, fail
from draftwheel.serving.server.cli_flags import TARGET_DEFAULT_HELP, add_device, add_dtype, add_k, add_min_path_prob

DEFAULT_CONFIG = SHIPPED_CONFIGS / "mining.yaml"


def register(subparsers: Any) -> None:
    traffic = subparsers.add_parser("traffic", help="replay a prompt workload through the engine, writing serving logs",
                                    description="Generate every workload prompt (chat template applied) and "
                                                "write one acceptance record per request to --log-dir, served "
                                                "as `draftwheel serve` serves by default (mode hybrid beside a "
                                                "suffix index built from --log-dir's logs, k 4, min_path_prob "
                                                "0.25). Flags only: it reads no config file.",
                                    **examples("draftwheel traffic --workload code --n 48",
                                               "draftwheel traffic --workload mixed --n 30 --seed 1 --k 5 "
                                               "--log-dir /tmp/draftwheel-logs",
                                               "draftwheel traffic --workload prompts.jsonl --draft none",
                                               "draftwheel traffic --workload mixed --n 32 --max-batch 8"))
    traffic.add_argument("--workload", required=True,
                         help="built-in workload (code, prose, chat, mixed, sql, tools, templated) or a JSONL file of {prompt, slice}")
    traffic.add_argument("--n", type=int, default=None, help="number of prompts (built-ins: default 30; files: all)")
    traffic.add_argument("--seed", type=int, default=0, help="workload seed (built-ins)")
    traffic.add_argument("--target", help=TARGET_DEFAULT_HELP)
    traffic.add_argument("--draft", help="draft model (default: models:/draftwheel-draft@champion); "
                                         "'none' serves the target alone")
    add_log_dir(traffic, "where to write the acceptance logs (default: $DRAFTWHEEL_HOME/logs)", type=Path)
    traffic.add_argument("--max-new-tokens", type=int, default=64)
    traffic.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    add_k(traffic, 4)
    add_min_path_prob(traffic, 0.25)
    traffic.add_argument("--suffix-tier", action=argparse.BooleanOptionalAction, default=True,
                         help="serve as `draftwheel serve` does by default: mode hybrid, beside a suffix index "
                              "built from --log-dir's logs that learns from every finished request "
                              "(--no-suffix-tier: the draft alone, mode draft)")
    add_dtype(traffic, "auto")
    add_device(traffic, "auto")
    traffic.add_argument("--max-batch", type=int, default=1,
                         help="requests decoding at once (continuous batching, as `draftwheel serve` decodes concurrent requests); "
                              "1: one at a time, each request's suffix index holding every earlier one")
    traffic.add_argument("--no-progress", action="store_true", help="no progress bar")
    traffic.set_defaults(func=_traffic_command)

    mine = subparsers.add_parser("mine", help="build distill/preference/holdout datasets + manifest from serving logs",
                                 description="Scan logs (bad lines quarantined), select hard samples per slice, "
                                             "scrub PII, dedupe, and write HF datasets and manifest.json.",
                                 **examples("draftwheel mine",
                                            "draftwheel mine --log-dir /tmp/draftwheel-logs --out /tmp/datasets "
                                            "holdout_fraction=0.2",
                                            "draftwheel mine --config configs/mining.yaml --set hard_quantile=0.5"))
    add_log_dir(mine, "the acceptance log dir (or one log file) to mine (default: $DRAFTWHEEL_HOME/logs)",
                type=Path)
    add_deprecated_alias(mine, "--logs", "--log-dir", "log_dir", type=Path)
    mine.add_argument("--out", type=Path, help="output dir (default: $DRAFTWHEEL_HOME/datasets, where the "
                                               "trainers and shadow read by default)")
    mine.add_argument("--config", type=Path, default=DEFAULT_CONFIG, metavar="FILE",
                      help="MiningConfig YAML (default: configs/mining.yaml)")
    mine.add_argument("--tokenizer", help="target tokenizer/model dir (enables preference pairs and re-tokenising; "
                                          "default: as the flywheel, the target the champion was trained for, "
                                          "else the reference target in the state dir if present)")
    add_override_arguments(mine, "holdout_fraction=0.2")
    mine.set_defaults(func=_mine_command)


def _traffic_command(args: argparse.Namespace) -> int:
    from draftwheel.home import logs_dir
    from draftwheel.mining.replay_workload import run_traffic, serving
    from draftwheel.mining.workloads import load_workload
    from draftwheel.serving.loading import engine_from_specs, resolve_target
    from draftwheel.serving.engine.params import SamplingParams
    from draftwheel.serving.engine.precision import resolve_device, resolve_dtype
    from draftwheel.serving.engine.reference import DEFAULT_DRAFT_URI
    from draftwheel.serving.server.serve_config import ServeConfig
    from draftwheel.serving.server.serving_state import startup_index

    try:
        if args.max_batch < 1:
            raise ValueError(f"--max-batch: must be >= 1, got {args.max_batch}")
        workload = load_workload(args.workload, args.n, args.seed)
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature, k=args.k)
        draft = None if args.draft == "none" else (args.draft or DEFAULT_DRAFT_URI)
        device = resolve_device(args.device)
        engine = engine_from_specs(resolve_target(args.target, draft), draft, device=device,
                                   dtype=resolve_dtype(args.dtype, device), min_path_prob=args.min_path_prob)
        log_dir = args.log_dir or logs_dir()
        if args.suffix_tier:  # the logs then say what the served stack missed (draftwheel.mining.residual)
            engine.suffix_index = startup_index(ServeConfig(), log_dir, engine.target.model_id)
    except (ValueError, OSError, RuntimeError) as exc:
        return fail("traffic", exc)
    with serving(engine, args.max_batch) as served:
        summary = run_traffic(served, workload, log_dir, params, chat=True, progress=not args.no_progress)
    print(json.dumps(summary, indent=2))
    return 0 if summary["requests"] else FAILURE


def _mine_command(args: argparse.Namespace) -> int:
    from draftwheel.config import load_config
    from draftwheel.home import logs_dir, mined_dir
    from draftwheel.mining.config import MiningConfig
    from draftwheel.mining.pipeline import mine
    from draftwheel.serving.loading import resolve_target

    overrides = list(args.overrides) + ([f"tokenizer={args.tokenizer}"] if args.tokenizer else [])
    try:
        config = load_config(MiningConfig, args.config, overrides)
    except ValueError as exc:  # ConfigError, or a value MiningConfig.__post_init__ refuses (names the field)
        print(f"draftwheel mine: config error: {exc}", file=sys.stderr)
        return USAGE
    try:
        if config.tokenizer is None:  # as the flywheel: the target's tokenizer, where there is one
            target = resolve_target(convert_reference=False)
            config = dataclasses.replace(config, tokenizer=target) if Path(target).is_dir() else config
        manifest = mine(args.log_dir or logs_dir(), args.out or mined_dir(), config)
    except (OSError, ValueError, RuntimeError) as exc:  # missing logs or tokenizer dir, unwritable out, registry
        return fail("mine", exc)
    counts = manifest["counts"]
    print(json.dumps({"out": str(args.out or mined_dir()), "counts": counts,
                      "redactions": manifest["redactions"]["total"]}, indent=2))
    return 0
