"""How well eagle3 drafts do on code they were not trained on: teacher-forced implied mean accepted length.

The demo's round trains on code from a few stdlib files and its gate replays a hold-out split of that
same traffic, while the demo's table measures other files (docs/results.md). This scores drafts on `--n`
code prompts of other workload seeds (default 1000 and 2000: the demo's table draws its held-out prompts
from seed 1000, its round trains on seed 0), with the target's greedy answers as the reference, the way
training's per-epoch probe scores chains (training.eagle_train).

    flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/eval_transfer.py \\
        --target <state>/models/smollm2-135m-instruct <draft dir> [<draft dir> ...]
Prints one line per draft: implied MAL at k and the acceptance at chain position 1.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from draftwheel.home import apply_offline_defaults
from mining.workloads import build_workload
from serving.models import load_model
from training.eagle_features import cached_features
from training.eagle_train import EagleDataset, Sequences, evaluate_chains, generation_model
from training.target_completions import target_traffic


def reference_sequences(target, prompts: list[str], max_new_tokens: int) -> Sequences:
    """Chat-templated prompts + the target's greedy answers, in bfloat16 as served, one prompt per
    generate call: batched bfloat16 generation is not row-invariant, so its answers could differ."""
    workload = [{"prompt": prompt, "slice": "code"} for prompt in prompts]
    rows = target_traffic(generation_model(target, bf16=True), target.tokenizer, workload, max_new_tokens,
                          batch_size=1, progress=False)
    seqs = Sequences([], [], [])
    for row in rows:
        seqs.add(row["prompt_token_ids"], row["completion_token_ids"], row["slice"],
                 max_length=len(row["prompt_token_ids"]) + max_new_tokens)
    return seqs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("drafts", nargs="+", help="eagle3 draft dirs")
    parser.add_argument("--target", required=True, help="the target model dir")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1000, 2000], help="code workload seeds")
    parser.add_argument("--per-seed", type=int, default=24, help="prompts drawn from each seed's workload")
    parser.add_argument("--n", type=int, default=32, help="prompts kept (the first distinct ones, seed by seed)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--cache", type=Path, default=Path("/tmp/draftwheel-transfer"), help="feature cache dir")
    args = parser.parse_args(argv)
    apply_offline_defaults()
    target = load_model(args.target)
    rows = [row for seed in args.seeds for row in build_workload("code", args.per_seed, seed)]
    prompts = list(dict.fromkeys(row["prompt"] for row in rows))[: args.n]
    seqs = reference_sequences(target, prompts, args.max_new_tokens)
    for path in args.drafts:
        draft = load_model(path).model.attach_target(target.model)
        features, _ = cached_features(target.model, seqs.ids, draft.c.aux_layer_ids, target.model_id.sha256,
                                      args.cache, bf16=True)
        result = evaluate_chains(draft, EagleDataset(seqs, features, prompt_loss=False), args.k, bf16=True)
        print(f"{path}: implied mean accepted length {result['slice.code.implied_mal']:.3f} (k={args.k}, "
              f"{len(prompts)} prompts), acceptance at position 1 {result['acceptance_pos1']:.3f}", flush=True)


if __name__ == "__main__":
    main()
