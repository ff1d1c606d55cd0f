"""`draftwheel generate` (one completion) and `draftwheel bench` (side-by-side benchmark).

Thin wrappers around `serving.engine.Engine` and `serving.bench.run_bench`; torch and transformers
are imported inside the command functions so `draftwheel --help` stays fast. Default target and
draft come from `serving.reference` (the reference target dir and the registry champion). Errors are one
line; the exit code follows `draftwheel.exit_codes` (2: an input the user can fix, 1: the run failed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from draftwheel.exit_codes import fail
from serving.precision import CHOICES as PRECISIONS


def _model_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", help="target: model dir, hub id or models:/NAME@ALIAS "
                                         "(default: $DRAFTWHEEL_HOME/models/smollm2-135m-instruct)")
    parser.add_argument("--draft", help="draft: model dir, hub id or models:/NAME@ALIAS "
                                        "(default: models:/draftwheel-draft@champion)")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per verification step (default 4)")
    parser.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template to prompts")
    parser.add_argument("--min-path-prob", type=float, default=0.0,
                        help="eagle3: stop drafting once the draft's own probability of the chain falls below this "
                             "(0 = always k tokens; 0.15-0.25 with --k 4-5 measured best on the reference target)")
    parser.add_argument("--dtype", choices=PRECISIONS, default="auto",
                        help="serving precision (default auto: bfloat16 on CPUs with AMX-BF16, where verifying "
                             "k+1 tokens costs about one decoding step; else float32)")


def register(subparsers: Any) -> None:
    gen = subparsers.add_parser("generate", help="one completion with speculative decoding",
                                description="Generate one completion; prints the text (or JSON with --json).")
    gen.add_argument("--prompt", required=True)
    _model_args(gen)
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

    bench = subparsers.add_parser("bench", help="benchmark: ours plain/speculative vs HF generate plain/assisted/"
                                               "prompt lookup",
                                  description="Greedy side-by-side benchmark on the same prompts in one run; "
                                              "writes the design.md bench keys as JSON. HF generate runs on an "
                                              "unpacked copy of the models (HF as users run it); HF "
                                              "assisted on the engine's own prepacked models is added as "
                                              "speedup_vs_hf_assisted_same_kernels.")
    _model_args(bench)
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
    bench.add_argument("--suffix-tier", action="store_true",
                       help="measure the draft as `draftwheel serve` runs it by default: mode hybrid with the "
                            "suffix tier (the request's own prompt and output, plus --suffix-logs)")
    bench.add_argument("--suffix-logs", type=Path,
                       help="with --suffix-tier: an acceptance-log dir whose requests the index holds "
                            "(default: none); the measured requests never join it")
    bench.set_defaults(func=_bench_command)

    export = subparsers.add_parser("export", help="write a registered eagle3 draft as a directory vLLM serves",
                                   description="Copy an eagle3 draft (a dir or models:/NAME@ALIAS) in the "
                                               "speculators EAGLE-3 format and check every field vLLM reads. Serve "
                                               "it with vLLM: LLM(model=TARGET, speculative_config={'method': "
                                               "'eagle3', 'model': OUT, 'num_speculative_tokens': K}).")
    export.add_argument("--uri", required=True, help="eagle3 draft: a dir or models:/draftwheel-draft@champion")
    export.add_argument("--format", choices=["speculators"], default="speculators")
    export.add_argument("--out", required=True, type=Path, help="output directory")
    export.set_defaults(func=_export_command)


def _load_engine(args: argparse.Namespace, with_draft: bool, medusa: str | None = None):
    from serving.engine import Engine
    from serving.precision import resolve_dtype
    from serving.reference import DEFAULT_DRAFT_URI, default_target_dir

    target = args.target or str(default_target_dir())
    draft = (args.draft or DEFAULT_DRAFT_URI) if with_draft else None
    return Engine.from_paths(target, draft, medusa=medusa, dtype=resolve_dtype(args.dtype),
                             min_path_prob=args.min_path_prob)


def _generate_command(args: argparse.Namespace) -> int:
    from serving.params import SamplingParams

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
    from serving.suffix import ReadOnlyIndex, SuffixIndex, target_key

    key = target_key(engine.target.model_id)
    if log_dir is not None and not log_dir.is_dir():
        raise ValueError(f"--suffix-logs: {log_dir} is not a directory")
    return ReadOnlyIndex(SuffixIndex.from_logs(log_dir, key) if log_dir is not None else SuffixIndex(key))


def _bench_command(args: argparse.Namespace) -> int:
    from serving.bench import read_prompts, run_bench, run_sampled_bench

    try:
        prompts = read_prompts(args.prompts)
        engine = _load_engine(args, with_draft=not args.medusa, medusa=args.medusa)
        if args.suffix_tier:
            engine.suffix_index = _bench_index(engine, args.suffix_logs)
        assistant = None
        if args.assistant:
            from serving.models import load_model

            assistant = load_model(args.assistant, dtype=engine.dtype).model
        if args.temperature > 0:
            result = run_sampled_bench(engine, prompts, args.max_new_tokens, k=args.k, chat=args.chat,
                                       temperature=args.temperature)
        else:
            result = run_bench(engine, prompts, args.max_new_tokens, k=args.k, chat=args.chat,
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
    from serving.eagle import Eagle3FormatError, export_speculators, is_eagle3_dir
    from serving.models import resolve_spec

    try:
        src = resolve_spec(args.uri)
        if not is_eagle3_dir(src):
            raise ValueError(f"{args.uri} ({src}) is not an eagle3 draft: only eagle3 drafts export to speculators")
        out = export_speculators(src, args.out)
    except (ValueError, OSError, Eagle3FormatError) as exc:
        return fail("export", exc)
    print(out)
    return 0

