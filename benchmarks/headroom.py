"""How much can a better draft still add as served? The suffix index's and each draft's acceptance at every position.

For each held-out prompt per slice (the rounds benchmark's: chat never trained on, fresh code, sql and
tools), the target's greedy output is decoded once. Then at every position p of it, with the context
up to p known, two proposals are read: the suffix index's (over the serving logs, as `draftwheel serve`
would have it, plus the request's own prompt and output so far; without its stretch, which a loop
verifies as far as the measured row cost says) and each eagle3 draft's chain (k tokens,
cut by min_path_prob, on the target's own features). Each proposal's accepted length at p is its common
prefix with the output (greedy verification accepts exactly that). No timing: the figures are counts.

Walks through those positions give the mean accepted length (tokens per target forward) of four policies:
- index only: the index's proposal when it has one, else a plain step (mode suffix);
- draft only: the draft's chain every step (mode draft, the draft alone);
- index first: the index when it proposes, else the draft (about what the hybrid does at its best);
- max: whichever of the two gets more accepted at that step (an oracle; verifying both in one forward,
  as a tree, would realise it, at the price of running the draft every step).
`headroom` = max ÷ index first − 1: what any choice between the two could add over the index-first walk.
A draft whose alone figure rises while the headroom stays small cannot make serving faster by itself.

    .venv/bin/python benchmarks/headroom.py --home rounds-full --drafts models:/draftwheel-draft@champion DIR...

The result is printed, saved as JSON under the state dir and logged to MLflow (bench_io).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from bench_io import add_output_arguments, save  # benchmarks/ is on sys.path when run as a script

POLICIES = ("index_only", "draft_only", "index_first", "max")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--home", default=None, help="the state dir ($DRAFTWHEEL_HOME; default: the current one)")
    parser.add_argument("--drafts", nargs="+", default=["models:/draftwheel-draft@champion"],
                        help="eagle3 drafts: dirs or models:/ URIs (default: the champion)")
    parser.add_argument("--logs", default=None, help="serving logs the index is built from (default: the state dir's "
                        "rounds/logs when it exists, else its logs/)")
    parser.add_argument("--eval", type=int, default=8, help="held-out prompts per slice")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--min-path-prob", type=float, default=0.25)
    parser.add_argument("--seed", type=int, default=0, help="the rounds benchmark's seed (the same held-out prompts)")
    add_output_arguments(parser, "headroom")
    return parser.parse_args(argv)


def index_column(index: Any, prompt_ids: list[int], output_ids: list[int]) -> list[int | None]:
    """At every output position after the first (the first comes from the prefill): the index's accepted
    length there, None without a proposal. A proposal is as long as a request with that much output left
    may draft (none at the last token)."""
    from draftwheel.serving.engine.acceptance import common_prefix
    from draftwheel.serving.engine.suffix import RequestIndex, SuffixConfig, best_proposal

    sequence = list(prompt_ids) + list(output_ids)
    local = RequestIndex(list(prompt_ids), index.config if index is not None else SuffixConfig())
    seen, column = len(prompt_ids), []
    for p in range(len(prompt_ids) + 1, len(sequence)):
        local.extend(sequence[seen:p])
        seen = p
        proposal = best_proposal(sequence[:p], len(sequence) - p - 1, local, index)
        column.append(common_prefix(proposal.tokens, sequence[p:]) if proposal.tokens else None)
    return column


def draft_column(target: Any, draft: Any, prompt_ids: list[int], output_ids: list[int], k: int,
                 cut: float, eos_ids: set[int] = frozenset()) -> list[int]:
    """At the same positions: the eagle3 draft's chain's accepted length (k tokens at most, cut by `cut`
    and stopped at a drafted token of `eos_ids`, on the target's own features)."""
    import torch

    from draftwheel.serving.engine.acceptance import common_prefix
    from draftwheel.serving.engine.eagle import DraftCall, DraftKV
    from draftwheel.serving.engine.eagle_decoding import EagleDrafter, _run_ahead, run_serial
    from draftwheel.serving.engine.kv import CachedLM
    from draftwheel.serving.engine.proposal import greedy_request

    sequence = list(prompt_ids) + list(output_ids)
    end = len(sequence)
    _, features = CachedLM(target).forward(torch.tensor(sequence), keep=1, aux=draft.c.aux_layer_ids)  # [L, 3H]
    drafter, kv, request = EagleDrafter(draft), DraftKV(), greedy_request(torch.tensor(sequence), k, eos_ids)
    slots, column = 0, []  # the draft cache holds slots 0..slots-1: feature of p with token p+1
    for p in range(len(prompt_ids) + 1, end):
        room = end - p - 1
        if room == 0:
            column.append(0)
            continue
        hidden, logits = run_serial(drafter.forward(DraftCall(torch.tensor(sequence[slots + 1:p]),
                                                              features[slots:p - 1], kv, project=True)))
        slots, committed = p - 1, kv.length
        drafted, _ = run_serial(_run_ahead(drafter, hidden, logits, min(k, room), kv, request, cut))
        kv.crop(committed)
        column.append(common_prefix(drafted.tolist(), sequence[p:]))
    return column


def walk(table: list[tuple[int | None, int]], policy: str) -> list[int]:
    """The accepted length of every step of a request decoded under `policy` (POLICIES), from its table
    (index_column and draft_column side by side, a position a row): each step accepts a tokens and emits a + 1, so the next step starts a + 1 further."""
    accepted, p = [], 0
    while p < len(table):
        by_index, by_draft = table[p]
        a = {"index_only": by_index or 0, "draft_only": by_draft, "max": max(by_index or 0, by_draft),
             "index_first": by_draft if by_index is None else by_index}[policy]
        accepted.append(a)
        p += a + 1
    return accepted


def mean_accepted_length(steps: list[list[int]]) -> float:
    """Tokens per target forward over all requests' steps."""
    flat = [a for request in steps for a in request]
    return sum(a + 1 for a in flat) / len(flat) if flat else 1.0


def measure(target: Any, drafts: dict[str, Any], index: Any, rows: dict[str, list[dict[str, str]]], params: Any,
            cut: float) -> dict[str, dict[str, dict[str, float]]]:
    """Per slice and draft: the mean accepted length of each policy and the headroom."""
    from tqdm import tqdm

    from draftwheel.serving.engine.engine import Engine

    plain = Engine(target)
    result: dict[str, dict[str, dict[str, float]]] = {}
    for key, slice_rows in rows.items():
        name = key.split("/", 1)[1]
        steps: dict[str, dict[str, list[list[int]]]] = {d: {p: [] for p in POLICIES} for d in drafts}
        for row in tqdm(slice_rows, desc=f"headroom {name}", unit="prompt", leave=False):
            done = plain.generate([row["prompt"]], params, slice=name, chat=True, mode="autoregressive")[0]
            by_index = index_column(index, done.prompt_token_ids, done.token_ids)  # the same for every draft
            for label, draft in drafts.items():
                table = list(zip(by_index, draft_column(target.model, draft.model, done.prompt_token_ids,
                                                        done.token_ids, params.k, cut, plain.eos_ids)))
                for policy in POLICIES:
                    steps[label][policy].append(walk(table, policy))
        result[name] = {}
        for label in drafts:
            figures = {policy: mean_accepted_length(steps[label][policy]) for policy in POLICIES}
            figures["headroom"] = figures["max"] / figures["index_first"] - 1.0
            result[name][label] = figures
    return result


def table_text(result: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [f"{'slice':<7} {'draft':<40} " + " ".join(f"{p:>11}" for p in POLICIES) + f" {'headroom':>9}"]
    for name, by_draft in result.items():
        for label, f in by_draft.items():
            lines.append(f"{name:<7} {label[-40:]:<40} " + " ".join(f"{f[p]:>11.2f}" for p in POLICIES)
                         + f" {f['headroom']:>+8.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.home:
        os.environ["DRAFTWHEEL_HOME"] = str(Path(args.home).resolve())
    from rounds import held_out

    from draftwheel.flows.bootstrap_flow import bootstrap_prompts
    from draftwheel.home import apply_offline_defaults, logs_dir, models_dir, state_dir
    from draftwheel.serving.engine.params import SamplingParams
    from draftwheel.serving.engine.precision import resolve_dtype
    from draftwheel.serving.engine.reference import ensure_reference_target
    from draftwheel.serving.engine.suffix import ReadOnlyIndex, SuffixIndex, target_key
    from draftwheel.serving.loading import load_model

    apply_offline_defaults()
    dtype = resolve_dtype("auto", "cpu")
    target = load_model(ensure_reference_target(models_dir()), "cpu", dtype)
    drafts = {}
    for spec in args.drafts:
        draft = load_model(spec, "cpu", dtype)
        if draft.kind != "eagle3":
            raise SystemExit(f"--drafts: {spec} is a {draft.kind} draft; headroom reads eagle3 drafts")
        draft.model.attach_target(target.model)
        drafts[spec] = draft
    logs = Path(args.logs) if args.logs else next(
        (d for d in (state_dir() / "rounds" / "logs", logs_dir()) if d.is_dir()), logs_dir())
    shared = SuffixIndex.from_logs(logs, target_key(target.model_id))
    index = ReadOnlyIndex(shared)
    rows = held_out(args.eval, args.seed, set(bootstrap_prompts()))
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0, k=args.k)
    result = measure(target, drafts, index, rows, params, args.min_path_prob)
    print(table_text(result))
    out = save("headroom", {"index_logs": str(logs), "index_requests": shared.requests, "slices": result}, args)
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
