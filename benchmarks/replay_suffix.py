"""Replay the suffix tier offline: try index settings on recorded traffic in seconds, not a benchmark run.

Why it is exact enough: a suffix proposal is a point mass, so (serving.verify) its first token is
accepted with probability p(x), and the target's own sample equals x with the same probability p(x); by
induction the accepted length of a proposal has the law of its common prefix with the continuation the
target sampled in plain decoding. So one plain-decoding trace per prompt replays mode `suffix` for any
index setting, at any temperature the trace was sampled at, without running the model again.

Two phases:
1. `collect` (minutes; run alone, under the heavy lock): bench_suffix's workloads on the reference
   target with plain decoding — the templated requests that seed the index (greedy), then the measured
   templated and chat prompts at each temperature — plus the target's verify-forward cost by row count
   on this machine (bench_tree_case.verify_cost); written to `--traces`.
2. `replay` (seconds): for each `--variant name:key=value,...` (SuffixConfig fields), mode `suffix` step
   by step as bench_suffix runs it (the index holds the log and each earlier measured request), and
   prints steps, steps without a proposal, the acceptance of drafted tokens and the modelled speed vs
   plain decoding: tokens / sum over steps of verify_cost(1 + drafted) / verify_cost(1).
   The model leaves out the index's own lookup time (~1 ms) and Python overhead; it ranks settings, it
   does not replace bench_suffix's measured tokens/s.

    flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/replay_suffix.py collect
    .venv/bin/python benchmarks/replay_suffix.py replay --variant base: --variant shared1:min_match=1
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from bench_serving import PROMPTS as CHAT_PROMPTS  # noqa: E402 - benchmarks/ is on sys.path as a script
from bench_serving import RESULTS
from serving.suffix import EMPTY, RequestIndex, SuffixConfig, SuffixIndex, best_proposal

TRACES = RESULTS / "replay_suffix_traces.json"


def collect(args: argparse.Namespace) -> None:
    import torch

    from bench_suffix import repetitive_prompts
    from bench_tree_case import verify_cost
    from draftwheel.home import apply_offline_defaults, models_dir
    from serving.engine import Engine
    from serving.models import load_model
    from serving.params import SamplingParams
    from serving.precision import dtype_name, resolve_dtype
    from serving.reference import ensure_reference_target

    apply_offline_defaults()
    torch.set_num_threads(1)  # as bench_suffix
    engine = Engine(load_model(ensure_reference_target(models_dir())), dtype=resolve_dtype("auto"))

    def plain(prompts: list[str], temperature: float) -> list[list[list[int]]]:
        rows = []
        for seed, prompt in enumerate(prompts):
            params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=temperature, seed=seed)
            completion, = engine.generate([prompt], params, chat=True, mode="autoregressive")
            rows.append([completion.prompt_token_ids, completion.token_ids])
        return rows

    traces: dict[str, Any] = {"dtype": dtype_name(engine.dtype), "max_new_tokens": args.max_new_tokens,
                              "log": plain(repetitive_prompts(args.log_requests, seed=1), 0.0)}
    workloads = {"repetitive": repetitive_prompts(args.measure, seed=2), "chat": CHAT_PROMPTS[: args.chat]}
    for temperature in args.temperatures:
        for name, prompts in workloads.items():
            print(f"{name} at temperature {temperature} ...", flush=True)
            traces[f"{name}_t{temperature}"] = plain(prompts, temperature)
    with torch.inference_mode():
        costs = verify_cost(engine.target.model, None, past=256, repeats=5)
    traces["verify_s_by_rows"] = {str(rows): s for rows, s in costs.items()}
    args.traces.write_text(json.dumps(traces) + "\n")
    print(f"wrote {args.traces}")


def relative_cost(verify_s_by_rows: dict[str, float]):
    rows = sorted(int(r) for r in verify_s_by_rows)
    seconds = [verify_s_by_rows[str(r)] / verify_s_by_rows[str(rows[0])] for r in rows]
    return lambda n: float(np.interp(n, rows, seconds))


def replay(traces: dict[str, Any], workload: str, config: SuffixConfig) -> dict[str, float]:
    """Mode `suffix` over one workload's traces (module docstring)."""
    cost = relative_cost(traces["verify_s_by_rows"])
    index = SuffixIndex("replay", config)
    for prompt, output in traces["log"]:
        index.add(prompt + output)
    tokens = steps = none = drafted = accepted = 0
    spent = 0.0
    for prompt, output in traces[workload]:
        context = prompt + output[:1]  # the first token comes from the prompt's forward alone (the prefill)
        local = RequestIndex(context, config)
        at, spent, steps = 1, spent + 1.0, steps + 1
        while at < len(output):
            room = len(output) - at - 1  # as serving: no draft past max_new_tokens
            proposal = best_proposal(context, room, local, index) if room > 0 else EMPTY
            n = 0
            while n < len(proposal.tokens) and proposal.tokens[n] == output[at + n]:
                n += 1
            emitted = output[at: at + n + 1]
            drafted, accepted, none = drafted + len(proposal.tokens), accepted + n, none + (not proposal.tokens)
            spent, steps = spent + cost(1 + len(proposal.tokens)), steps + 1
            context += emitted
            local.extend(emitted)
            at += len(emitted)
        tokens += len(output)
        index.add(prompt + output)  # as serving adds a finished request
    return {"steps": steps, "no_proposal": none, "acceptance": accepted / drafted if drafted else 0.0,
            "speed_vs_plain": tokens / spent}


def parse_variant(text: str) -> tuple[str, SuffixConfig]:
    """'name:key=value,key=value' -> (name, SuffixConfig); values are ints or floats."""
    name, _, settings = text.partition(":")
    fields: dict[str, int | float] = {}
    for item in filter(None, settings.split(",")):
        key, _, value = item.partition("=")
        fields[key.strip()] = float(value) if "." in value else int(value)
    return name, SuffixConfig(**fields)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("phase", choices=["collect", "replay"])
    parser.add_argument("--traces", type=Path, default=TRACES)
    parser.add_argument("--log-requests", type=int, default=32)
    parser.add_argument("--measure", type=int, default=24)
    parser.add_argument("--chat", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    parser.add_argument("--variant", action="append", default=[],
                        help="name:key=value,... (SuffixConfig fields); default: the shipped settings")
    args = parser.parse_args(argv)
    if args.phase == "collect":
        collect(args)
        return
    traces = json.loads(args.traces.read_text())
    workloads = [key for key in traces if key.startswith(("repetitive_t", "chat_t"))]
    for name, config in [parse_variant(v) for v in args.variant or ["shipped:"]]:
        for workload in workloads:
            result = replay(traces, workload, config)
            print(f"{name:>12} {workload:>16}: {result['speed_vs_plain']:.3f}x plain (modelled), "
                  f"{result['steps']} steps, {result['no_proposal']} without a proposal, "
                  f"acceptance {result['acceptance']:.2f}", flush=True)


if __name__ == "__main__":
    main()
