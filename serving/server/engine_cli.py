"""`draftwheel generate` (one completion) and `draftwheel bench` (side-by-side benchmark).

Thin wrappers around `draftwheel.serving.engine.engine.Engine` and `draftwheel.evaluation.bench.run_bench`; torch and transformers
are imported inside the command functions so `draftwheel --help` stays fast. `generate` takes flags
only (default target and draft from `draftwheel.serving.engine.reference`: the reference target dir and the registry
champion). `bench` measures what `draftwheel serve` runs: it reads the same `ServeConfig` (configs/
serve.yaml, `--config`, overrides, then the flags of the same names), so by default k 4,
`min_path_prob` 0.25 and mode hybrid with the suffix tier; `--no-suffix-tier --min-path-prob 0` measures
the draft alone. Errors are one line; the exit code follows `draftwheel.exit_codes` (2: an input the user
can fix, 1: the run failed).
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
from draftwheel.serving.server.cli_flags import add_dtype, add_k, add_min_path_prob
from draftwheel.serving.server.cli import add_config_argument

TARGET_HELP = "target: model dir, hub id or models:/NAME@ALIAS (default: $DRAFTWHEEL_HOME/models/smollm2-135m-instruct)"
DRAFT_HELP = "draft: model dir, hub id or models:/NAME@ALIAS (default: models:/draftwheel-draft@champion)"
CHAT_HELP = "apply the tokenizer's chat template to prompts"


def _add_generate(subparsers: Any) -> None:
    gen = subparsers.add_parser("generate", help="one completion with speculative decoding",
                                description="Generate one completion; prints the text (or JSON with --json). "
                                            "Flags only: it reads no config file.",
                                **examples('draftwheel generate --prompt "def fib(n):" --k 5 --max-new-tokens 32',
                                           'draftwheel generate --prompt "Hello!" --chat --temperature 0.7 '
                                           '--seed 0 --json',
                                           'draftwheel generate --prompt "Hello!" --no-draft --dtype float32'))
    gen.add_argument("--prompt", required=True)
    gen.add_argument("--target", help=TARGET_HELP)
    gen.add_argument("--draft", help=DRAFT_HELP)
    add_k(gen, 4)
    gen.add_argument("--chat", action="store_true", help=CHAT_HELP)
    add_min_path_prob(gen, 0.0)
    add_dtype(gen, "auto")
    gen.add_argument("--no-draft", action="store_true", help="plain decoding with the target alone")
    gen.add_argument("--max-new-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int)
    gen.add_argument("--adaptive-k", action="store_true", help="choose k per step (up to --k)")
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    gen.add_argument("--json", action="store_true", help="print the completion, stats and record as JSON")
    gen.set_defaults(func=_generate_command)


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
    bench.add_argument("--target", help=TARGET_HELP.replace("(default: ", "(default: the config's, else "))
    bench.add_argument("--draft", help="draft: model dir, hub id or models:/NAME@ALIAS (default: the config's, "
                                       "models:/draftwheel-draft@champion)")
    add_k(bench, None)
    bench.add_argument("--chat", action="store_true", help=CHAT_HELP)
    add_min_path_prob(bench, None)
    add_dtype(bench, None)
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


def register(subparsers: Any) -> None:
    _add_generate(subparsers)
    _add_bench(subparsers)
    export = subparsers.add_parser("export", help="write a registered eagle3 draft as a directory vLLM serves",
                                   description="Write an eagle3 draft (a dir or models:/NAME@ALIAS) in the "
                                               "speculators EAGLE-3 format with the target's Hugging Face id and "
                                               "embedding table, and check every field vLLM reads. Serve it with "
                                               "vLLM: `vllm serve OUT`, or LLM(model=TARGET, speculative_config="
                                               "{'method': 'eagle3', 'model': OUT, 'num_speculative_tokens': K}).",
                                   **examples("draftwheel export --uri models:/draftwheel-draft@champion "
                                              "--format speculators --out exported-draft"))
    export.add_argument("--uri", required=True, help="eagle3 draft: a dir or models:/draftwheel-draft@champion")
    export.add_argument("--format", choices=["speculators"], default="speculators")
    export.add_argument("--out", required=True, type=Path, help="output directory (refused if not empty)")
    export.add_argument("--force", action="store_true", help="replace a non-empty --out")
    export.add_argument("--target", help="the target's model dir, whose embedding table the export carries "
                                         "(default: $DRAFTWHEEL_HOME/models/smollm2-135m-instruct)")
    export.add_argument("--verifier", help="the target's Hugging Face id recorded for vLLM, ORG/NAME (default: "
                                           "the one the draft recorded, e.g. HuggingFaceTB/SmolLM2-135M-Instruct)")
    export.set_defaults(func=_export_command)


def _load_engine(args: argparse.Namespace, with_draft: bool):
    from draftwheel.serving.engine.engine import Engine
    from draftwheel.serving.engine.precision import resolve_dtype
    from draftwheel.serving.engine.reference import DEFAULT_DRAFT_URI, default_target_dir

    target = args.target or str(default_target_dir())
    draft = (args.draft or DEFAULT_DRAFT_URI) if with_draft else None
    return Engine.from_paths(target, draft, dtype=resolve_dtype(args.dtype), min_path_prob=args.min_path_prob)


def _generate_command(args: argparse.Namespace) -> int:
    from draftwheel.serving.engine.params import SamplingParams

    try:
        params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                top_p=args.top_p, top_k=args.top_k, seed=args.seed, k=args.k,
                                adaptive_k=args.adaptive_k, stop=args.stop)
        engine = _load_engine(args, with_draft=not args.no_draft)
        completion, = engine.generate([args.prompt], params, slice="cli", chat=args.chat)
    except (ValueError, OSError, RuntimeError) as exc:
        return fail("generate", exc)
    if args.json:
        print(json.dumps(dataclasses.asdict(completion), ensure_ascii=False, indent=2))
    else:
        print(completion.text)
    return 0


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
                         "min_path_prob": args.min_path_prob, "dtype": args.dtype})
    return dataclasses.replace(config, draft=None) if args.medusa else config


def _bench_engine(config: Any, suffix_logs: Path | None) -> Any:
    """The engine serve would build from `config` (the suffix index read-only, from `suffix_logs`)."""
    from draftwheel.serving.engine.engine import Engine
    from draftwheel.serving.engine.precision import resolve_dtype
    from draftwheel.serving.engine.reference import default_target_dir

    engine = Engine.from_paths(config.target or str(default_target_dir()), config.draft,
                               medusa=None if config.draft else config.medusa, device=config.device,
                               dtype=resolve_dtype(config.dtype, config.device), min_path_prob=config.min_path_prob)
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
            from draftwheel.serving.engine.models import load_model

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


def _export_command(args: argparse.Namespace) -> int:
    from draftwheel.serving.engine.eagle import Eagle3FormatError, is_eagle3_dir
    from draftwheel.serving.engine.eagle_export import export_speculators
    from draftwheel.serving.engine.models import resolve_spec
    from draftwheel.serving.engine.reference import default_target_dir

    try:
        src = resolve_spec(args.uri)
        if not is_eagle3_dir(src):
            raise ValueError(f"{args.uri} ({src}) is not an eagle3 draft: only eagle3 drafts export to speculators")
        target = resolve_spec(args.target) if args.target else default_target_dir()
        out = export_speculators(src, args.out, target, verifier=args.verifier or "", force=args.force)
    except (ValueError, OSError, Eagle3FormatError) as exc:
        return fail("export", exc)
    print(out)
    return 0

