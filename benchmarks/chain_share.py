"""One EAGLE-3 training step with every chain unrolled vs a sample of them (`ttt_chain_share`), one run.

What a round pays per step at its shapes (8 sequences x 300 positions, 3 unroll steps, the draft
vocabulary of configs/eagle.yaml, forward + backward + AdamW, float32 unless --bf16) for each share.
The shares take turns, round after round, so a VM whose speed drifts during the run slows them alike;
the figure is each share's median step time and its ratio to every chain's.

    flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/chain_share.py

What the sampled chains cost in quality is not measured here: docs/results.md ("Half the chains")
trains issue 13's round both ways.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from draftwheel.home import apply_offline_defaults
from serving.eagle import Eagle3Config, Eagle3Draft
from serving.models import load_model
from serving.reference import default_target_dir
from training.eagle_ttt import unrolled_loss


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shares", type=float, nargs="+", default=[1.0, 0.5, 0.25])
    parser.add_argument("--rounds", type=int, default=5, help="timed steps per share (after one warm-up each)")
    parser.add_argument("--positions", type=int, default=300)
    parser.add_argument("--draft-vocab", type=int, default=4096)
    parser.add_argument("--bf16", action="store_true", help="under bfloat16 autocast (fast on AMX-BF16 CPUs only)")
    args = parser.parse_args(argv)
    apply_offline_defaults()
    torch.manual_seed(0)
    target = load_model(str(default_target_dir())).model.eval()
    config = Eagle3Config.for_target(target.config, draft_vocab_size=args.draft_vocab)
    draft = Eagle3Draft(config).attach_target(target).train()
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-4)
    h, t = target.config.hidden_size, args.positions
    ids = torch.randint(0, target.config.vocab_size, (8, t))
    aux, hidden, mask = torch.randn(8, t, 3 * h), torch.randn(8, t, h), torch.ones(8, t, dtype=torch.bool)
    lm_head = target.get_output_embeddings().weight.detach()

    def step(share: float) -> float:
        start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss, _ = unrolled_loss(draft, ids, aux, hidden, mask, lm_head, 3, 0.8, share)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return time.perf_counter() - start

    for share in args.shares:  # warm-up: oneDNN picks and caches its kernels on the first call of a shape
        step(share)
    times: dict[float, list[float]] = {share: [] for share in args.shares}
    for _ in range(args.rounds):
        for share in args.shares:
            times[share].append(step(share))
    full = statistics.median(times[args.shares[0]])
    print(f"eagle training step, 8 x {t} positions, 3 unroll steps, draft vocabulary {args.draft_vocab}, "
          f"{'bfloat16' if args.bf16 else 'float32'}, median of {args.rounds}:")
    for share in args.shares:
        median = statistics.median(times[share])
        print(f"  ttt_chain_share {share:g}: {median:.3f} s  ({median / full:.2f}x the time of share {args.shares[0]:g})")


if __name__ == "__main__":
    main()
