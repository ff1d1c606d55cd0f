"""`draftwheel bench`: our plain and speculative decoding side by side with HF `generate` on the same prompts.

`bench` measures what `draftwheel serve` runs: it reads the same `ServeConfig` (configs/serve.yaml,
`--config`, overrides, then the flags of the same names), so by default k 4, `min_path_prob` 0.25 and mode
hybrid with the suffix tier; `--no-suffix-tier --min-path-prob 0` measures the draft alone. Heavy imports
happen inside the command so `draftwheel --help` stays fast. Errors are one line; the exit code follows
`draftwheel.exit_codes` (2: an input the user can fix, 1: the run failed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from draftwheel.cli_help import examples
from draftwheel.config import add_override_arguments
from draftwheel.exit_codes import fail
from draftwheel.serving.server.cli import add_config_argument
from draftwheel.serving.server.cli_flags import TARGET_DEFAULT_HELP, add_device, add_dtype, add_k, add_min_path_prob
from draftwheel.serving.server.engine_cli import CHAT_HELP


def register(subparsers: Any) -> None:
    _add_bench(subparsers)


def _add_bench(subparsers: Any) -> None:
    bench = subparsers.add_parser(
        "bench", help="benchmark: ours plain/speculative vs HF generate plain/assisted/prompt lookup",
        description="Greedy side-by-side benchmark on the same prompts in one run; prints JSON: tokens/s and "
                    "speedup of each method, acceptance rate, mean accepted length, greedy identity, the "
                    "draft's measured cost c. It measures what `draftwheel serve` runs: the same "
                    "ServeConfig (--config, overrides, then --target/--draft/--k/--min-path-prob/--dtype), so "
                    "by default mode hybrid with the suffix tier, k 4, min_path_prob 0.25. HF generate runs on "
                    "an unpacked copy of the models (HF as users run it); HF assisted on the engine's own "
                    "prepacked models is added as speedup_vs_hf_assisted_same_kernels.",
        **examples("draftwheel bench --chat --prompts benchmarks/prompts/chat_heldout.jsonl --out bench.json",
                   "draftwheel bench --chat --prompts benchmarks/prompts/chat_heldout.jsonl "
                   "--no-suffix-tier --min-path-prob 0  # the draft alone",
                   "draftwheel bench --prompts benchmarks/prompts/chat_heldout.jsonl --set k=5 min_path_prob=0.15",
                   "draftwheel bench --prompts prompts.txt --target meta-llama/Llama-3.2-1B-Instruct "
                   "--draft my-org/my-draft --chat"))
    add_config_argument(bench)
    add_override_arguments(bench, "min_path_prob=0.15")
    bench.add_argument("--target", help=TARGET_DEFAULT_HELP.replace("(default: ", "(default: the config's, else "))
    bench.add_argument("--draft", help="draft: model dir, hub id or models:/NAME@ALIAS (default: the config's, "
                                       "models:/draftwheel-draft@champion)")
    add_k(bench, None)
    bench.add_argument("--chat", action="store_true", help=CHAT_HELP)
    add_min_path_prob(bench, None)
    add_dtype(bench, None)
    add_device(bench, None)
    bench.add_argument("--prompts", required=True, type=Path, help="text file (one prompt a line) or JSONL")
    bench.add_argument("--max-new-tokens", type=int, default=64)
    bench.add_argument("--out", type=Path, help="write the JSON result here")
    bench.add_argument("--assistant", help="a small causal LM for the HF assisted baseline when --draft is "
                                           "not one (e.g. an eagle3 draft); default: --draft itself")
    bench.add_argument("--medusa", help="Medusa heads dir: benchmark medusa mode instead of a draft")
    bench.add_argument("--temperature", type=float, default=0.0,
                       help="> 0: measure sampling instead (ours plain vs speculative, same seeds; no HF)")
    bench.add_argument("--prompt-lookup-tokens", type=int, default=10,
                       help="tokens per guess of the HF prompt-lookup baseline (default 10)")
    bench.add_argument("--suffix-tier", action=argparse.BooleanOptionalAction, default=None,
                       help="mode hybrid with the suffix tier (the request's own prompt and output, plus "
                            "--suffix-logs), as `draftwheel serve` runs by default; --no-suffix-tier measures "
                            "the draft alone (default: the config's suffix_tier, true, unless its mode is draft)")
    bench.add_argument("--suffix-logs", type=Path,
                       help="with the suffix tier: an acceptance-log dir whose requests the index holds "
                            "(default: none); the measured requests never join it")
    bench.set_defaults(func=_bench_command)


def _bench_index(engine: Any, log_dir: Path | None) -> Any:
    """A read-only suffix index for the bench (from `log_dir`, else empty): every prompt runs in several
    methods, and none may draft from another method's answer to the same prompt."""
    from draftwheel.serving.engine.suffix import ReadOnlyIndex, SuffixIndex, target_key

    key = target_key(engine.target.model_id)
    if log_dir is not None and not log_dir.is_dir():
        raise ValueError(f"--suffix-logs: {log_dir} is not a directory")
    return ReadOnlyIndex(SuffixIndex.from_logs(log_dir, key) if log_dir is not None else SuffixIndex(key))


def bench_settings(args: argparse.Namespace) -> Any:
    """The ServeConfig `bench` measures: serve's settings (YAML, overrides), then bench's flags. The suffix
    tier is on when `--suffix-tier` says so, else as serve runs: the config's `suffix_tier` unless its
    `mode` is draft (bench picks the mode from the tier, so `mode` is cleared). `--medusa` benchmarks
    heads instead of the draft."""
    from draftwheel.serving.server.cli import load_serve_config, with_flags

    config = load_serve_config(args.config, args.overrides)
    tier = args.suffix_tier if args.suffix_tier is not None else config.suffix_tier and config.mode != "draft"
    config = with_flags(dataclasses.replace(config, mode=None, suffix_tier=tier),
                        {"target": args.target, "draft": args.draft, "medusa": args.medusa, "k": args.k,
                         "min_path_prob": args.min_path_prob, "dtype": args.dtype, "device": args.device})
    return dataclasses.replace(config, draft=None) if args.medusa else config


def _bench_engine(config: Any, suffix_logs: Path | None) -> Any:
    """The engine serve would build from `config` (the suffix index read-only, from `suffix_logs`)."""
    from draftwheel.serving.loading import engine_from_specs, resolve_target
    from draftwheel.serving.engine.precision import resolve_device, resolve_dtype

    device = resolve_device(config.device)
    engine = engine_from_specs(resolve_target(config.target, config.draft), config.draft,
                               medusa=None if config.draft else config.medusa, device=device,
                               dtype=resolve_dtype(config.dtype, device), **config.engine_settings())
    if config.suffix_tier and engine.draft is not None:
        engine.suffix_index = _bench_index(engine, suffix_logs)
    return engine


def _bench_command(args: argparse.Namespace) -> int:
    from draftwheel.evaluation.bench import read_prompts, run_bench, run_sampled_bench

    config = bench_settings(args)  # a ConfigError is the dispatcher's one line, exit 2
    try:
        prompts = read_prompts(args.prompts)
        engine = _bench_engine(config, args.suffix_logs)
        assistant = None
        if args.assistant:
            from draftwheel.serving.loading import load_model

            assistant = load_model(args.assistant, dtype=engine.dtype).model
        if args.temperature > 0:
            result = run_sampled_bench(engine, prompts, args.max_new_tokens, k=config.k, chat=args.chat,
                                       temperature=args.temperature)
        else:
            result = run_bench(engine, prompts, args.max_new_tokens, k=config.k, chat=args.chat,
                               assistant=assistant, prompt_lookup_tokens=args.prompt_lookup_tokens)
    except (ValueError, OSError, RuntimeError) as exc:
        return fail("bench", exc)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0
