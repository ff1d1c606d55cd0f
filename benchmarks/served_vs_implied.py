"""Does greedy serving lose acceptance against teacher forcing? The engine's own mean accepted length per
request, beside the implied one and serving's walk over the same teacher-forced chains.

Each prompt is served greedily by the engine (eagle3 draft, full chains of k: `--min-path-prob 0`),
then the target's features of prompt + answer are computed in one forward and the draft is unrolled
over them (training.eagle_ttt.unroll). Printed per request: the engine's MAL, the walk's
(training.eagle_ttt.served_walk: chains anchored where the last step left off, as the engine anchors
them) and the implied MAL (every answer position's chain averaged, as the probe's `implied_mal`).
Equal engine and walk figures mean the engine drafts exactly what teacher forcing predicts; the implied
figure runs above both because serving meets the positions after a miss more often (docs/results.md).

    flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/served_vs_implied.py \\
        --target <state>/models/smollm2-135m-instruct --draft <eagle3 dir> --prompts prompts.jsonl
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from draftwheel.home import apply_offline_defaults


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True, help="the target model dir")
    parser.add_argument("--draft", required=True, help="an eagle3 draft dir")
    parser.add_argument("--prompts", required=True, type=Path, help="JSONL with a `prompt` per line (chat-templated)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    apply_offline_defaults()
    from serving.engine import Engine
    from serving.params import SamplingParams
    from training.eagle_train import answer_chains
    from training.eagle_ttt import chain_acceptance, implied_mal, served_walk

    prompts = [json.loads(line)["prompt"] for line in args.prompts.read_text().splitlines() if line.strip()]
    engine = Engine.from_paths(args.target, args.draft, prepack=False)
    draft, target = engine.draft.model, engine.target.model
    totals = {"engine": [0, 0], "walk": [0, 0]}
    implied_totals, counted = [0] * args.k, 0
    same = 0
    for prompt in prompts:
        c = engine.generate([prompt], SamplingParams(max_new_tokens=args.max_new_tokens, k=args.k), chat=True,
                            mode="draft")[0]
        logits, reference, mask = answer_chains(target, draft, c.prompt_token_ids, c.token_ids, args.k)
        served = (c.record.accepted_tokens + c.record.verify_steps, c.record.verify_steps)
        walked = served_walk(logits, reference, draft, mask)
        accepted, n = chain_acceptance(logits, reference, draft, mask)
        implied_totals = [a + b for a, b in zip(implied_totals, accepted)]
        counted += n
        same += served == walked
        for name, (tokens, steps) in (("engine", served), ("walk", walked)):
            totals[name] = [totals[name][0] + tokens, totals[name][1] + steps]
        print(f"engine {served[0] / served[1]:.3f}  walk {walked[0] / walked[1]:.3f}  "
              f"implied {implied_mal(accepted, n):.3f}  ({len(c.token_ids)} tokens)", flush=True)
    print(f"overall: engine {totals['engine'][0] / totals['engine'][1]:.3f}, walk "
          f"{totals['walk'][0] / totals['walk'][1]:.3f}, implied {implied_mal(implied_totals, counted):.3f}; "
          f"engine = walk on {same}/{len(prompts)} requests")


if __name__ == "__main__":
    main()
