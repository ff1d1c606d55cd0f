"""Is a static draft tree worth building on this CPU? (issue 11, item 9: "only if the benchmark shows the gain")

A tree adds sibling candidates (the draft's 2nd choice) next to the chain, verified in the same target
forward under a tree attention mask. Its gain and its price can both be measured without building it:
- price: what one more row costs in the verification forward, measured on the engine's target (bfloat16
  where the CPU has AMX, prepacked, row-invariant attention) at `--past` cached tokens, rows 1..24,
  interleaved and repeated so a change in machine load hits every row count alike;
- gain: how often the draft's 2nd choice at the first draft position is the target's token when its 1st
  is not (a sibling there then adds one token to the step), teacher-forced on a hold-out of the target's
  own greedy outputs (the bootstrap's chat hold-out by default), with the target's own features, exactly
  the position-1 situation of serving.

It prints both and the break-even: a sibling pays when P(1st wrong, 2nd right) / MAL exceeds the
relative cost of one more row in a speculative step. Run alone, under the heavy lock:
    flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/bench_tree_case.py --draft DIR --holdout DIR
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from draftwheel.home import apply_offline_defaults, models_dir
from serving.eagle import DraftKV
from serving.kv import CachedLM
from serving.models import load_model
from serving.precision import resolve_dtype
from serving.prepack import prepack_linears
from serving.reference import ensure_reference_target
from serving.row_invariant import use_row_invariant_attention

ROWS = (1, 2, 4, 6, 8, 12, 16, 24)


def verify_cost(model: torch.nn.Module, aux: list[int], past: int, repeats: int) -> dict[int, float]:
    """Median seconds of a forward over r new rows after `past` cached tokens, for r in ROWS."""
    cached = CachedLM(model)
    cached.forward(torch.randint(0, model.config.vocab_size, (past,)), keep=1)
    times: dict[int, list[float]] = {rows: [] for rows in ROWS}
    for repeat in range(repeats + 2):  # the first two rounds warm up
        for rows in ROWS:
            start = time.perf_counter()
            cached.forward(torch.randint(0, model.config.vocab_size, (rows,)), keep=rows, aux=aux)
            if repeat >= 2:
                times[rows].append(time.perf_counter() - start)
            cached.rollback(rows)
    return {rows: statistics.median(values) for rows, values in times.items()}


@torch.inference_mode()
def first_position_choices(target: torch.nn.Module, draft, holdout: Path) -> dict[str, float]:
    """Teacher-forced top-1/top-2 accuracy of the draft at draft position 1 over the hold-out outputs."""
    from datasets import load_from_disk

    counted = top1 = top2 = 0
    for row in load_from_disk(str(holdout)):
        ids = torch.tensor(row["prompt_token_ids"] + row["output_token_ids"])
        out = target(input_ids=ids.unsqueeze(0), output_hidden_states=True)
        features = torch.cat([out.hidden_states[i][0] for i in draft.c.aux_layer_ids], -1)  # [T, 3H]
        greedy = out.logits[0].argmax(-1)  # [T]: the target's token after each prefix
        # Slot j pairs the target's features at position j with token j+1 and predicts token j+2.
        hidden = draft.extend(ids[1:], draft.project(features[:-1]), DraftKV())
        top = draft.draft_to_target[draft.logits(hidden).float().topk(2, -1).indices]  # [T-1, 2]
        for j in range(len(row["prompt_token_ids"]) - 2, len(ids) - 2):
            truth = int(greedy[j + 1])
            if truth != int(ids[j + 2]):  # this forward's rounding picks another token than the log: skip
                continue
            counted += 1
            top1 += truth == int(top[j, 0])
            top2 += truth in top[j].tolist()
    return {"positions": counted, "top1": top1 / counted, "top2": top2 / counted,
            "first_wrong_second_right": (top2 - top1) / counted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draft", required=True, help="an eagle3 draft dir (the bootstrap v0)")
    parser.add_argument("--holdout", required=True, type=Path, help="a hold-out dataset of the target's outputs")
    parser.add_argument("--past", type=int, default=150)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--mal", type=float, default=1.82, help="the chain's measured mean accepted length")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    apply_offline_defaults()
    dtype = resolve_dtype("auto")
    target = load_model(ensure_reference_target(models_dir()), dtype=dtype).model
    draft = load_model(args.draft, dtype=dtype).model.attach_target(target)  # it shares the target's embeddings
    choices = first_position_choices(target, draft, args.holdout)
    prepack_linears(target)
    use_row_invariant_attention(target)
    cost = verify_cost(target, draft.c.aux_layer_ids, args.past, args.repeats)
    per_row = (cost[8] - cost[4]) / 4 / cost[1]  # one more row, relative to a one-row step
    result = {"dtype": str(dtype), "verify_s_by_rows": cost, "row_cost_vs_step": per_row, **choices,
              "mal": args.mal, "sibling_gain_vs_mal": choices["first_wrong_second_right"] / args.mal}
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
