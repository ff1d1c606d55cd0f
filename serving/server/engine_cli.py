"""`draftwheel generate` (one completion) and `draftwheel export` (an eagle3 draft in the format vLLM serves).

Thin wrappers around the engine; torch and transformers are imported inside the command functions so
`draftwheel --help` stays fast. `generate` takes flags only (default draft: the registry champion; default
target: the one that draft was trained for, `draftwheel.serving.loading.resolve_target`). Errors are one
line; the exit code follows `draftwheel.exit_codes` (2: an input the user can fix, 1: the run failed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

from draftwheel.cli_help import examples
from draftwheel.exit_codes import fail
from draftwheel.serving.server.cli_flags import TARGET_DEFAULT_HELP, add_device, add_dtype, add_k, add_min_path_prob

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
    gen.add_argument("--target", help=TARGET_DEFAULT_HELP)
    gen.add_argument("--draft", help=DRAFT_HELP)
    add_k(gen, 4)
    gen.add_argument("--chat", action="store_true", help=CHAT_HELP)
    add_min_path_prob(gen, 0.0)
    add_dtype(gen, "auto")
    add_device(gen, "auto")
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


def register(subparsers: Any) -> None:
    _add_generate(subparsers)
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
                                         "(default: the one the draft was trained for, as the registry recorded it)")
    export.add_argument("--verifier", help="the target's Hugging Face id recorded for vLLM, ORG/NAME (default: "
                                           "the one the draft recorded, e.g. HuggingFaceTB/SmolLM2-135M-Instruct)")
    export.set_defaults(func=_export_command)


def _load_engine(args: argparse.Namespace, with_draft: bool):
    from draftwheel.serving.loading import engine_from_specs, resolve_target
    from draftwheel.serving.engine.precision import resolve_device, resolve_dtype
    from draftwheel.serving.engine.reference import DEFAULT_DRAFT_URI

    draft = args.draft or DEFAULT_DRAFT_URI
    device = resolve_device(args.device)
    return engine_from_specs(resolve_target(args.target, draft), draft if with_draft else None, device=device,
                             dtype=resolve_dtype(args.dtype, device), min_path_prob=args.min_path_prob)


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


def _export_command(args: argparse.Namespace) -> int:
    from draftwheel.serving.engine.eagle import Eagle3FormatError, is_eagle3_dir
    from draftwheel.serving.engine.eagle_export import export_speculators
    from draftwheel.serving.loading import resolve_spec, resolve_target

    try:
        src = resolve_spec(args.uri)
        if not is_eagle3_dir(src):
            raise ValueError(f"{args.uri} ({src}) is not an eagle3 draft: only eagle3 drafts export to speculators")
        target = resolve_spec(resolve_target(args.target, args.uri))
        out = export_speculators(src, args.out, target, verifier=args.verifier or "", force=args.force)
    except (ValueError, OSError, Eagle3FormatError) as exc:
        return fail("export", exc)
    print(out)
    return 0

