"""Shadow replay in this process vs in worker processes, one after the other in one run: does
`ShadowConfig.workers` pay on this machine? Prints both replay times, their ratio, and whether every
request's accepted lengths, tokens and the gate's verdict came out the same.

By default both runs replay as served (the shipped config: mode hybrid, the choices on the cost model),
where each worker takes whole slices, so each draft's step pace carries from one request of a slice to
the next as in one process; `--draft-alone` replays mode draft, where workers take the next prompt.
Each replay process loads the models itself, so workers pay only once there are enough prompts to
amortise that start (draftwheel.evaluation.shadow). As served, each run measures the cost model's
constants again (row costs, the drafts' c), and a request whose choices they move is counted as differing.

    .venv/bin/python benchmarks/shadow_workers.py --champion DIR --challenger DIR \\
        --holdout $DRAFTWHEEL_HOME/datasets/holdout
A shared machine's speed drifts during a run: run it a second time with --workers-first.
The JSON goes to --out (default $DRAFTWHEEL_HOME/benchmarks/shadow_workers.json) and the run to MLflow.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench_io import add_output_arguments, save


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from draftwheel.config import add_override_arguments

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--champion", required=True, help="champion draft: dir or models:/NAME@ALIAS")
    parser.add_argument("--challenger", required=True, help="challenger draft: dir or models:/NAME@ALIAS")
    parser.add_argument("--holdout", required=True, help="a mined holdout/ dataset dir")
    parser.add_argument("--target", default=None, help="target model dir (default: the reference target)")
    parser.add_argument("--workers", type=int, default=2, help="worker processes of the other replay")
    parser.add_argument("--workers-first", action="store_true", help="replay with the workers first")
    parser.add_argument("--draft-alone", action="store_true", help="replay mode draft (suffix_tier=false)")
    parser.add_argument("--config", type=Path, default=None, help="ShadowConfig YAML (default configs/shadow.yaml)")
    add_override_arguments(parser, "include_canary=false")
    add_output_arguments(parser, "shadow_workers")
    return parser.parse_args(argv)


def compare(champion: str, challenger: str, target: str, holdout: str, config: Any, workers: int,
            workers_first: bool = False) -> dict[str, Any]:
    """Replay in one process and in `workers` processes (in the order asked); times and whether they agree."""
    from draftwheel.evaluation.shadow import replay_figures, run_shadow

    reports, seconds = {}, {}
    for n in ((workers, 1) if workers_first else (1, workers)):
        start = time.perf_counter()
        reports[n] = run_shadow(champion, challenger, target, holdout, replace(config, workers=n))
        seconds[n] = time.perf_counter() - start
        print(f"workers={n}: {seconds[n]:.1f} s (replay {reports[n]['replay_seconds']:.1f} s), "
              f"{len(reports[n]['requests'])} requests, promote {reports[n]['decision']['promote']}", flush=True)
    alone, shared = reports[1], reports[workers]
    return {"requests": len(alone["requests"]), "workers": workers, "workers_first": workers_first,
            "replay_s_one_process": alone["replay_seconds"], "replay_s_workers": shared["replay_seconds"],
            "wall_s_one_process": seconds[1], "wall_s_workers": seconds[workers],
            "replay_speedup": alone["replay_seconds"] / shared["replay_seconds"],
            "wall_speedup": seconds[1] / seconds[workers],
            "figures_identical": replay_figures(alone) == replay_figures(shared),
            "requests_identical": sum(a == b for a, b in zip(replay_figures(alone), replay_figures(shared))),
            "verdict_identical": alone["decision"]["promote"] == shared["decision"]["promote"]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from draftwheel.config import load_config, stage_config_path
    from draftwheel.home import apply_offline_defaults
    from draftwheel.evaluation.gate import ShadowConfig
    from draftwheel.serving.engine.reference import default_target_dir

    apply_offline_defaults()
    path = str(args.config) if args.config else (stage_config_path("", "shadow") or None)
    config = load_config(ShadowConfig, path, [*args.overrides, *(["suffix_tier=false"] if args.draft_alone else [])])
    result = compare(args.champion, args.challenger, args.target or str(default_target_dir()), args.holdout,
                     config, args.workers, args.workers_first)
    out = save("shadow_workers", result, args)
    print(f"speed-up {result['replay_speedup']:.2f}x (replay), {result['wall_speedup']:.2f}x (wall); figures "
          f"identical: {result['requests_identical']}/{result['requests']} requests, verdict identical: "
          f"{result['verdict_identical']}; wrote {out}")
    return result


if __name__ == "__main__":  # workers are spawned processes: they import this module again
    main()
