"""Shadow replay of one round, in this process vs in worker processes, one after the other in one run
(`ShadowConfig.workers`, serving.shadow). Prints both replay times, their ratio, and whether every
request's accepted lengths, tokens and the gate's verdict came out the same.

    flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/shadow_workers.py \\
        --champion <registry>/1 --challenger <registry>/2 --holdout <flywheel run>/datasets/holdout
"""

from __future__ import annotations

import argparse
import time

from draftwheel.home import apply_offline_defaults
from serving.gate import ShadowConfig
from serving.reference import default_target_dir
from serving.shadow import replay_figures, run_shadow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--champion", required=True, help="champion draft dir")
    parser.add_argument("--challenger", required=True, help="challenger draft dir")
    parser.add_argument("--holdout", required=True, help="a mined holdout/ dataset dir")
    parser.add_argument("--target", default=None, help="target model dir (default: the reference target)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the other replay")
    parser.add_argument("--workers-first", action="store_true",
                        help="replay with the workers first (the VM's speed drifts: run both orders)")
    args = parser.parse_args()
    apply_offline_defaults()
    target = args.target or str(default_target_dir())
    reports, seconds = {}, {}
    for workers in ((args.workers, 1) if args.workers_first else (1, args.workers)):
        start = time.perf_counter()
        reports[workers] = run_shadow(args.champion, args.challenger, target, args.holdout,
                                      ShadowConfig(workers=workers))
        seconds[workers] = time.perf_counter() - start
        print(f"workers={workers}: {seconds[workers]:.1f} s (replay {reports[workers]['replay_seconds']:.1f} s), "
              f"{len(reports[workers]['requests'])} requests, promote {reports[workers]['decision']['promote']}",
              flush=True)
    alone, shared = reports[1], reports[args.workers]
    same = replay_figures(alone) == replay_figures(shared) and alone["decision"] == shared["decision"]
    print(f"speed-up {alone['replay_seconds'] / shared['replay_seconds']:.2f}x (replay), "
          f"{seconds[1] / seconds[args.workers]:.2f}x (wall); figures and verdict identical: {same}")


if __name__ == "__main__":
    main()
