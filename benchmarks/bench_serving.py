"""Serving benchmark on a constructed pair (a) and on the reference target (b), each in one run of
`draftwheel.evaluation.bench.run_bench`: our plain and speculative decoding against HF `generate` on the same prompts.

pair a: a constructed pair with acceptance exactly 1 (draftwheel.serving.testing.zero_extended_target): a 1-layer
        draft of width `--hidden` (draftwheel.serving.testing's 384-token vocabulary, or SmolLM2's with --vocab smollm2)
        and a 12-layer target whose extra 11 layers have zeroed output projections. Reports both
        speedups, the measured draft/target cost ratio c, the theoretical speedup E/(1 + k*c) with
        E = k + 1, and our speedup's ratio to it (wall clock and CPU time), plus the measured cost of the
        (k+1)-token verify forward. It needs no download: it measures the decoding loop and kernels.
pair b: the reference target (SmolLM2-135M-Instruct) with a draft made of its first layers (same
        tokenizer); reports greedy identity against HF generate and the speeds, plus the adaptive-k run.
run_bench runs HF generate on unpacked copies of the models (as users run it) and adds HF assisted on
the engine's own prepacked models, so the kernels' share of the edge is reported too.

Timings are only as quiet as the machine: run it alone.
    .venv/bin/python benchmarks/bench_serving.py --pair a
    .venv/bin/python benchmarks/bench_serving.py --pair a --vocab smollm2 --out pair_a_smollm2.json
    .venv/bin/python benchmarks/bench_serving.py --pair b
The JSON goes to --out (default $DRAFTWHEEL_HOME/benchmarks/bench_serving_<pair>.json) and the run to
MLflow (benchmarks/bench_io.py).
"""

from __future__ import annotations

import argparse
import copy
import json
import time

import torch
from transformers import AutoTokenizer

from bench_io import add_output_arguments, save
from draftwheel.home import apply_offline_defaults, models_dir
from draftwheel.serving.engine.adaptive import speedup
from draftwheel.evaluation.bench import run_bench
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.kv import CachedLM
from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.loading import load_model
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.reference import ensure_reference_target
from draftwheel.serving.testing import build_tokenizer, tiny_llama, zero_extended_target

PROMPTS = [
    "Write a Python function that reverses a linked list.",
    "Explain why the sky is blue in two sentences.",
    "List three uses of a hash map.",
    "What is the capital of France and what is it known for?",
    "Summarise the plot of Romeo and Juliet.",
    "def fibonacci(n):",
    "Give me a haiku about autumn rain.",
    "How do I sort a dictionary by value in Python?",
]


def forward_seconds(model: torch.nn.Module, n_tokens: int, context: int = 64, repeats: int = 30) -> dict:
    """Median wall and CPU time of one cached forward over `n_tokens` new tokens after `context` tokens."""
    vocab = model.config.vocab_size
    wall, cpu = [], []
    for _ in range(repeats):
        lm = CachedLM(model)
        lm.forward((torch.arange(context) * 7 + 5) % vocab, keep=1)
        new = (torch.arange(n_tokens) * 11 + 3) % vocab
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        lm.forward(new)
        wall.append(time.perf_counter() - start_wall)
        cpu.append(time.process_time() - start_cpu)
    return {"wall": sorted(wall)[repeats // 2], "cpu": sorted(cpu)[repeats // 2]}


def pair_a(args: argparse.Namespace) -> dict:
    prompts = PROMPTS[: args.n_prompts]
    if args.vocab == "smollm2":
        tokenizer = AutoTokenizer.from_pretrained(ensure_reference_target(models_dir()))
    else:
        tokenizer = build_tokenizer()
    draft = tiny_llama(tokenizer, n_layers=1, hidden=args.hidden, heads=max(1, args.hidden // 64), seed=0,
                       tie_embeddings=True)
    target = zero_extended_target(draft, 12)
    engine = Engine(from_objects(target, tokenizer, "zero-extended-12L"), from_objects(draft, tokenizer, "draft-1L"))
    # c and the verify cost are measured on the engine's (prepacked) models: the ones being timed.
    draft_s, target_s = forward_seconds(draft, 1), forward_seconds(target, 1)
    verify_s = forward_seconds(target, args.k + 1)
    c = draft_s["cpu"] / target_s["cpu"]  # CPU time: robust to other jobs on the shared cores
    result = run_bench(engine, prompts, args.max_new_tokens, k=args.k, chat=True, cpu_time=True)
    theory = speedup(1.0, args.k, c)  # E = k + 1 at acceptance 1
    result.update({
        "measured_c": c, "measured_c_wall": draft_s["wall"] / target_s["wall"],
        "draft_forward_s": draft_s, "target_forward_s": target_s, "target_verify_forward_s": verify_s,
        "verify_cost_vs_one_token": verify_s["cpu"] / target_s["cpu"],
        # The textbook model prices the (k+1)-token verify like a 1-token forward; on a CPU it is not.
        "theoretical_speedup_with_measured_verify_cost": (args.k + 1) / (verify_s["cpu"] / target_s["cpu"] + args.k * c),
        "vocab": f"{args.vocab} ({len(tokenizer)} tokens)", "hidden": args.hidden, "target_layers": 12, "draft_layers": 1,
        "theoretical_speedup": theory, "ratio_to_theory": result["speedup_vs_plain"] / theory,
        "cpu_ratio_to_theory": result["cpu_speedup_vs_plain"] / theory,
        "goal_ratio_to_theory_ge_0.8": result["speedup_vs_plain"] / theory >= 0.8,
        "goal_speedup_vs_hf_assisted_gt_1.2": result["speedup_vs_hf_assisted"] > 1.2,
    })
    return result


def first_layers_draft(target: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    """The target's embeddings, first `n_layers` layers, final norm and head: same vocab, cheaper."""
    draft = copy.deepcopy(target)
    draft.model.layers = draft.model.layers[:n_layers]
    draft.config.num_hidden_layers = n_layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:n_layers]
    return draft


def adaptive_run(engine: Engine, prompts: list[str], max_new_tokens: int, k_max: int) -> dict:
    """Our speculative decoding with the adaptive-k controller on the same prompts: speed and chosen k."""
    params = SamplingParams(max_new_tokens=max_new_tokens, k=k_max, adaptive_k=True)
    start = time.perf_counter()
    completions = engine.generate(prompts, params, slice="bench", chat=True)
    seconds = time.perf_counter() - start
    ks = [step.k for c in completions for step in c.record.steps]
    return {"adaptive_spec_tokens_per_s": sum(len(c.token_ids) for c in completions) / seconds,
            "adaptive_k_max": k_max, "adaptive_mean_k": sum(ks) / len(ks),
            "adaptive_k_histogram": {str(k): ks.count(k) for k in sorted(set(ks))}}


def pair_b(args: argparse.Namespace) -> dict:
    target = load_model(ensure_reference_target(models_dir()))
    draft = first_layers_draft(target.model, args.draft_layers)
    engine = Engine(target, from_objects(draft, target.tokenizer, f"smollm2-first-{args.draft_layers}-layers"))
    prompts = PROMPTS[: args.n_prompts]
    result = run_bench(engine, prompts, args.max_new_tokens, k=args.k, chat=True, cpu_time=True)
    result.update(adaptive_run(engine, prompts, args.max_new_tokens, k_max=8))
    result.update({"target": str(target.path), "target_sha256": target.model_id.sha256,
                   "draft": f"first {args.draft_layers} of {target.model.config.num_hidden_layers} target layers"})
    return result


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--pair", choices=["a", "b"], required=True)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--n-prompts", type=int, default=len(PROMPTS), help="how many of the 8 prompts to run")
    parser.add_argument("--draft-layers", type=int, default=4, help="pair b: target layers kept in the draft")
    parser.add_argument("--vocab", choices=["smollm2", "toy"], default="toy",
                        help="pair a: the SmolLM2 tokenizer (49152 tokens) or draftwheel.serving.testing's (384 tokens)")
    parser.add_argument("--hidden", type=int, default=576, help="pair a: model width (576 = SmolLM2-135M's)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for all four methods (default 1: multi-threaded kernels slow down "
                             "badly when another job takes a core)")
    add_output_arguments(parser, "bench_serving_<pair>")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    apply_offline_defaults()
    torch.set_num_threads(args.threads)
    start = time.time()
    result = pair_a(args) if args.pair == "a" else pair_b(args)
    result.update({"pair": args.pair, "torch_threads": torch.get_num_threads(), "wall_s": time.time() - start})
    out = save(f"bench_serving_{args.pair}", result, args)
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
