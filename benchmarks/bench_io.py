"""Where a benchmark's result goes: one JSON file and one MLflow run.

The JSON goes to `--out`, by default `$DRAFTWHEEL_HOME/benchmarks/<name>.json` (the state dir, where
everything else the project writes lives). Unless `--no-tracking`, the run is also logged to MLflow
(the state dir's sqlite store, or `MLFLOW_TRACKING_URI`) as a run named after the benchmark, tagged
`benchmark=<name>`: the command's arguments as params, every numeric figure of the result as a metric
(nested keys joined by dots) and the JSON as an artifact. So the history of a figure lives in MLflow,
not in the repository.

Not a benchmark itself: the scripts beside it import it. It does not time or measure anything.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from pathlib import Path
from typing import Any

_METRIC_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


def add_output_arguments(parser: argparse.ArgumentParser, name: str) -> None:
    """`--out` and `--no-tracking`, the same on every benchmark."""
    parser.add_argument("--out", type=Path, default=None,
                        help=f"result JSON (default: $DRAFTWHEEL_HOME/benchmarks/{name}.json)")
    parser.add_argument("--no-tracking", action="store_true", help="do not log the run to MLflow")


def default_out(name: str) -> Path:
    from draftwheel.home import state_dir

    return state_dir() / "benchmarks" / f"{name}.json"


def numeric_figures(result: Any, prefix: str = "") -> dict[str, float]:
    """Every finite number in a nested result (bools excluded), keyed by its dotted path, in a form MLflow
    accepts as a metric name."""
    figures: dict[str, float] = {}
    if isinstance(result, dict):
        for key, value in result.items():
            figures.update(numeric_figures(value, f"{prefix}{_METRIC_KEY.sub('_', str(key))}."))
    elif isinstance(result, (list, tuple)):
        for i, value in enumerate(result):
            figures.update(numeric_figures(value, f"{prefix}{i}."))
    elif isinstance(result, (int, float)) and not isinstance(result, bool) and math.isfinite(result):
        figures[prefix.rstrip(".")] = float(result)
    return figures


def save(name: str, result: dict[str, Any], args: argparse.Namespace) -> Path:
    """Write `result` as JSON to `args.out` (or the default) and, unless `args.no_tracking`, log the run."""
    out = Path(args.out) if args.out else default_out(name)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    if not args.no_tracking:
        from draftwheel.tracking import get_tracker

        tracker = get_tracker(True)
        with tracker.run(name, tags={"benchmark": name}):
            tracker.log_params({k: v for k, v in vars(args).items() if k not in ("out", "no_tracking")})
            tracker.log_metrics(numeric_figures(result))
            tracker.log_artifact(out)
    return out
