"""Suffix-tier benchmark: plain decoding, the neural draft, suffix, hybrid, the router and HF prompt
lookup on the same prompts, in one run.

Workloads (built here, seeded):
- `repetitive`: templated requests whose answers share long spans, as agentic and SQL traffic do — SQL
  over three fixed schemas and JSON tool calls. `--log-requests` of them are served first and written
  to an acceptance log; the suffix index is then built from that log (the start-up path), and the
  measured requests use other values in the same templates.
- `chat`: bench_serving's diverse prompts (nothing like them in the log).
`router` is draftwheel.serving.engine.router's LinUCB choosing per request among its arms (it starts untrained and learns
over the run, so it pays its exploration here). Each measured prompt runs every method back to back on
the same index state: the runs see the index read-only, and the prompt's own output is added once after
all methods ran (as serving would have added it), so no method drafts from another method's output of
the same prompt. Greedy outputs of all methods are compared with plain decoding (`greedy_identical`);
sampled runs are timed only. Also measured: the index at `--index-requests` logged requests (default
100k; default bounds, so the oldest are evicted): its size, process RSS growth, update cost per request
and proposal cost (µs).

The reference run (minutes on 2 CPU cores; run it alone):
    .venv/bin/python benchmarks/bench_suffix.py --k 5 --min-path-prob 0.15 --measure 8 --chat 8 \\
        --max-new-tokens 64
On tiny random models (seconds; checks that it runs, measures nothing about real traffic):
    .venv/bin/python benchmarks/bench_suffix.py --model tiny --log-requests 6 --measure 3 --chat 2 \\
        --max-new-tokens 24 --index-requests 2000
The JSON goes to --out (default $DRAFTWHEEL_HOME/benchmarks/bench_suffix.json) and the run to MLflow.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import torch

from bench_io import add_output_arguments, save
from bench_serving import PROMPTS as CHAT_PROMPTS  # benchmarks/ is on sys.path when run as a script
from bench_serving import first_layers_draft
from draftwheel.evaluation.bench import stock_copy
from draftwheel.home import apply_offline_defaults, models_dir
from draftwheel.mining.workloads import templated_prompts
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.models import from_objects
from draftwheel.serving.loading import load_model
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.precision import CHOICES, dtype_name, resolve_dtype
from draftwheel.serving.engine.reference import DEFAULT_DRAFT_URI, ensure_reference_target
from draftwheel.serving.engine.router import ARMS, Router, features
from draftwheel.serving.engine.sink import JsonlSink
from draftwheel.serving.engine.suffix import ReadOnlyIndex, SuffixConfig, SuffixIndex, target_key
from draftwheel.serving.testing import build_tokenizer, tiny_llama

METHODS = ("plain", "draft", "suffix", "hybrid", "router")
MODE = {"plain": "autoregressive", "draft": "draft", "suffix": "suffix", "hybrid": "hybrid"}


def routed(router: Router, engine: Engine, prompt: str, params: SamplingParams, slice: str,
           recent: list[float]):
    """One request decoded the way the router chooses; it learns from the measured tokens/s."""
    ids = engine.encode(prompt, chat=True)[1]
    x = features(router.config, slice, len(ids), engine.suffix_index.propose(ids, 16).match_len,
                 sum(recent[-8:]) / len(recent[-8:]) if recent else 0.5)
    arm = router.choose(x)
    mode, k = ARMS[arm]
    completion, = engine.generate([prompt], SamplingParams(**{**params.__dict__, "k": k or params.k}),
                                  slice=slice, chat=True, mode=mode)
    router.update(arm, x, completion.stats.tokens_per_s)
    if completion.record.drafted_tokens:
        recent.append(completion.record.acceptance_rate)
    return completion


def repetitive_prompts(n: int, seed: int) -> list[str]:
    """n templated requests (SQL over three schemas, JSON tool calls: draftwheel.mining.workloads)."""
    return templated_prompts(n, seed)


def load_pair(args: argparse.Namespace):
    """(target, draft) LoadedModels: the reference target and `--draft`, or tiny random models."""
    if args.model == "tiny":
        tokenizer = build_tokenizer()
        target = tiny_llama(tokenizer, n_layers=4, hidden=128, seed=0, tie_embeddings=False)
        return (from_objects(target, tokenizer, "tiny-target"),
                from_objects(first_layers_draft(target, 1), tokenizer, "tiny-first-layer"))
    target = load_model(ensure_reference_target(models_dir()))
    if args.draft == "first-layers":
        draft = first_layers_draft(target.model, args.draft_layers)
        return target, from_objects(draft, target.tokenizer, f"first-{args.draft_layers}-layers")
    return target, load_model(args.draft)


def log_phase(engine: Engine, prompts: list[str], max_new_tokens: int, log_dir: Path) -> dict:
    """Serve the log requests greedily into an acceptance log; time building the index from it."""
    engine.sink = JsonlSink(log_dir)
    engine.generate(prompts, SamplingParams(max_new_tokens=max_new_tokens), slice="repetitive", chat=True,
                    mode="autoregressive")
    engine.sink.close()
    engine.sink = None
    start = time.perf_counter()
    index = SuffixIndex.from_logs(log_dir, target_key(engine.target.model_id))
    return {"index": index, "load_s": time.perf_counter() - start}


def hf_prompt_lookup(model: Any, ids: list[int], params: SamplingParams, lookup: int) -> tuple[list[int], float]:
    input_ids = torch.tensor([ids])
    sampling = {"do_sample": True, "temperature": params.temperature, "top_k": 0, "top_p": 1.0} \
        if not params.greedy else {"do_sample": False}
    torch.manual_seed(params.seed or 0)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=params.max_new_tokens,
                             prompt_lookup_num_tokens=lookup, **sampling)
    return out[0, len(ids):].tolist(), time.perf_counter() - start


def run_workload(engine: Engine, index: SuffixIndex, hf_target: Any, prompts: list[str], params: SamplingParams,
                 lookup: int, router: Router, slice: str) -> dict:
    """Every method on every prompt (see the module docstring); tokens/s, identity and source stats."""
    tokens = dict.fromkeys((*METHODS, "hf_prompt_lookup"), 0)
    seconds = dict.fromkeys(tokens, 0.0)
    identical = dict.fromkeys(tokens, 0)
    by_source: dict[str, list[int]] = {}  # source -> [steps, drafted, accepted] over suffix/hybrid runs
    engine.suffix_index = ReadOnlyIndex(index)
    recent: list[float] = []
    for number, prompt in enumerate(prompts):
        run_params = SamplingParams(**{**params.__dict__, "seed": number})
        outputs = {}
        for method in METHODS:
            start = time.perf_counter()
            if method == "router":
                completion = routed(router, engine, prompt, run_params, slice, recent)
            else:
                completion, = engine.generate([prompt], run_params, slice=slice, chat=True, mode=MODE[method])
            seconds[method] += time.perf_counter() - start
            outputs[method] = completion
            if method in ("suffix", "hybrid"):
                for step in completion.record.steps:
                    row = by_source.setdefault(f"{method}/{step.source or 'none'}", [0, 0, 0])
                    row[0], row[1], row[2] = row[0] + 1, row[1] + step.k, row[2] + step.accepted
        hf_ids, hf_s = hf_prompt_lookup(hf_target, outputs["plain"].prompt_token_ids, run_params, lookup)
        seconds["hf_prompt_lookup"] += hf_s
        plain_ids = outputs["plain"].token_ids
        for method, ids in [(m, outputs[m].token_ids) for m in METHODS] + [("hf_prompt_lookup", hf_ids)]:
            tokens[method] += len(ids)
            identical[method] += int(ids == plain_ids)
        index.add_record(outputs["plain"].record)  # as serving adds a finished request
    engine.suffix_index = index
    rate = {m: tokens[m] / seconds[m] for m in tokens}
    result = {f"{m}_tokens_per_s": r for m, r in rate.items()}
    result.update({
        "hybrid_vs_draft": rate["hybrid"] / rate["draft"], "suffix_vs_draft": rate["suffix"] / rate["draft"],
        "hybrid_vs_hf_prompt_lookup": rate["hybrid"] / rate["hf_prompt_lookup"],
        "hybrid_vs_plain": rate["hybrid"] / rate["plain"], "router_vs_hybrid": rate["router"] / rate["hybrid"],
        "router_pulls": dict(router.pulls), "prompts": len(prompts),
        "steps_by_source": {s: {"steps": v[0], "drafted": v[1], "accepted": v[2],
                                "acceptance_rate": v[2] / v[1] if v[1] else 0.0} for s, v in by_source.items()},
    })
    if params.greedy:
        result["greedy_identical"] = {m: f"{identical[m]}/{len(prompts)}" for m in tokens}
    return result


def index_scale(sequences: list[list[int]], n: int, vocab: int, seed: int = 0) -> dict:
    """The default-bounded index after n logged requests (variants of `sequences`): size, RSS growth,
    update cost per request and proposal cost."""
    rng = np.random.default_rng(seed)
    process = psutil.Process()
    rss_before = process.memory_info().rss
    index = SuffixIndex("scale", SuffixConfig())
    update_us = np.empty(n)
    for i in range(n):
        seq = np.array(sequences[i % len(sequences)])
        seq[rng.integers(0, len(seq), 3)] = rng.integers(0, vocab, 3)  # every request a little different
        tokens = seq.tolist()
        start = time.perf_counter()
        index.add(tokens)
        update_us[i] = (time.perf_counter() - start) * 1e6
    propose_us = []
    for seq in sequences[:50]:
        for cut in range(8, len(seq), max(1, len(seq) // 8)):
            start = time.perf_counter()
            index.propose(seq[:cut], 16)
            propose_us.append((time.perf_counter() - start) * 1e6)
    return {"logged_requests": n, "kept_requests": index.requests, "kept_tokens": index.tokens,
            "config": SuffixConfig().__dict__, "index_bytes": index.nbytes(),
            "rss_growth_bytes": process.memory_info().rss - rss_before,
            "update_us_mean": float(update_us.mean()), "update_us_p50": float(np.percentile(update_us, 50)),
            "update_us_p99": float(np.percentile(update_us, 99)),
            "propose_us_mean": float(np.mean(propose_us)), "propose_us_p99": float(np.percentile(propose_us, 99))}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--model", choices=["reference", "tiny"], default="reference")
    parser.add_argument("--draft", default=DEFAULT_DRAFT_URI,
                        help="reference: the neural draft (dir or models:/ URI), or 'first-layers'")
    parser.add_argument("--draft-layers", type=int, default=4, help="with --draft first-layers")
    parser.add_argument("--log-requests", type=int, default=32, help="repetitive requests logged first")
    parser.add_argument("--measure", type=int, default=12, help="repetitive requests measured")
    parser.add_argument("--chat", type=int, default=len(CHAT_PROMPTS), help="chat prompts measured")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--k", type=int, default=4, help="the neural draft's k")
    parser.add_argument("--min-path-prob", type=float, default=0.0,
                        help="eagle3 drafts: cut a chain below this draft path probability (serving)")
    parser.add_argument("--dtype", choices=CHOICES, default="auto", help="serving precision (draftwheel.serving.engine.precision)")
    parser.add_argument("--temperatures", default="0,0.7")
    parser.add_argument("--lookup-tokens", type=int, default=10, help="HF prompt_lookup_num_tokens")
    parser.add_argument("--index-requests", type=int, default=100_000)
    parser.add_argument("--threads", type=int, default=1)
    add_output_arguments(parser, "bench_suffix")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    apply_offline_defaults()
    torch.set_num_threads(args.threads)
    wall = time.time()
    target, draft = load_pair(args)
    engine = Engine(target, draft, dtype=resolve_dtype(args.dtype), min_path_prob=args.min_path_prob)
    hf_target = stock_copy(engine.target.model)  # HF as users run it (stock kernels and attention)
    result: dict[str, Any] = {"target": target.model_id.name, "draft": draft.model_id.name, "draft_kind": draft.kind,
                              "dtype": dtype_name(engine.dtype), "k": args.k, "min_path_prob": args.min_path_prob,
                              "max_new_tokens": args.max_new_tokens, "torch_threads": torch.get_num_threads()}
    with tempfile.TemporaryDirectory() as log_dir:
        logged = log_phase(engine, repetitive_prompts(args.log_requests, seed=1), args.max_new_tokens, Path(log_dir))
    index = logged["index"]
    result["index_load_s"], result["logged_requests"] = logged["load_s"], index.requests
    sequences = index.sequences()  # the logged requests, before the measured ones are added
    router = Router(champion=draft.model_id.name)  # learns across both workloads and temperatures, in order
    workloads = {"repetitive": repetitive_prompts(args.measure, seed=2), "chat": CHAT_PROMPTS[: args.chat]}
    for temperature in [float(t) for t in args.temperatures.split(",")]:
        params = SamplingParams(max_new_tokens=args.max_new_tokens, k=args.k, temperature=temperature)
        engine.generate([workloads["chat"][0]], SamplingParams(max_new_tokens=4), chat=True)  # warm-up
        for name, prompts in workloads.items():
            print(f"{name} at temperature {temperature} ...", flush=True)
            result[f"{name}_t{temperature}"] = run_workload(engine, index, hf_target, prompts, params,
                                                            args.lookup_tokens, router, name)
    print(f"index at {args.index_requests} logged requests ...", flush=True)
    result["index_scale"] = index_scale(sequences, args.index_requests,
                                        engine.target.model.config.vocab_size)
    result["wall_s"] = time.time() - wall
    out = save("bench_suffix", result, args)
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
