"""Two serving settings side by side, as served: which makes `draftwheel serve` faster on held-out traffic?

One draft, the suffix index over the serving logs (as `serve` would have it, read-only), and per slice
the rounds benchmark's held-out prompts (chat never trained on; fresh code, sql and tools). Every prompt
is decoded plain, with setting A and with setting B (mode hybrid, greedy), in turn, so a change in the
machine's load hits all three alike; `--repeats` runs the whole comparison again, because the hybrid's
choices follow measured step times and so differ a little from run to run. Reported per slice and
repetition: speed against plain decoding and mean accepted length of each setting, greedy identity,
and B ÷ A; then the repetitions' mean.

Settings are engine settings of configs/serve.yaml's names: `index_branch` (verify the index's proposal
beside the draft's chain as one token tree) and `min_path_prob` (the chain cut); and the suffix index's
(`draftwheel.serving.engine.suffix.SuffixConfig`, prefixed `suffix_`): `suffix_spec_factor`,
`suffix_spec_offset` (how long a proposal a match of a given length may make), `suffix_stretch_factor`
(how far past that it offers tokens the loop verifies where they pay), `suffix_min_token_prob`.
An arm whose index settings differ gets its own index over the same logs.

    .venv/bin/python benchmarks/served_ab.py --home DIR --a index_branch=false --b index_branch=true --repeats 2

The result is printed, saved as JSON under the state dir and logged to MLflow (bench_io).
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

from bench_io import add_output_arguments, save  # benchmarks/ is on sys.path when run as a script

SETTINGS = {"index_branch": lambda text: {"true": True, "false": False}[text.lower()], "min_path_prob": float,
            "suffix_spec_factor": float, "suffix_spec_offset": float, "suffix_stretch_factor": float,
            "suffix_min_token_prob": float}
INDEX_PREFIX = "suffix_"  # settings of the index (SuffixConfig's field after the prefix), not of the engine


def split_setting(settings: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """A parsed setting -> (engine keyword arguments, SuffixConfig overrides)."""
    engine = {k: v for k, v in settings.items() if not k.startswith(INDEX_PREFIX)}
    index = {k[len(INDEX_PREFIX):]: v for k, v in settings.items() if k.startswith(INDEX_PREFIX)}
    return engine, index


def parse_setting(items: list[str]) -> dict[str, Any]:
    """["index_branch=false", ...] -> engine keyword arguments; a clear error naming a bad key or value."""
    settings = {"min_path_prob": 0.25}  # configs/serve.yaml's
    for item in items:
        key, _, value = item.partition("=")
        if key not in SETTINGS:
            raise SystemExit(f"setting {key!r}: not one of {', '.join(SETTINGS)}")
        try:
            settings[key] = SETTINGS[key](value)
        except (KeyError, ValueError):
            raise SystemExit(f"setting {key}: bad value {value!r}") from None
    return settings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--home", default=None, help="the state dir ($DRAFTWHEEL_HOME; default: the current one)")
    parser.add_argument("--draft", default="models:/draftwheel-draft@champion",
                        help="the draft: a dir or models:/ URI (default: the champion)")
    parser.add_argument("--logs", default=None, help="serving logs the index is built from (default: the state dir's "
                        "rounds/logs when it exists, else its logs/)")
    parser.add_argument("--a", nargs="*", default=[], metavar="KEY=VALUE", help="setting A (default: serve's)")
    parser.add_argument("--b", nargs="*", default=[], metavar="KEY=VALUE", help="setting B")
    parser.add_argument("--slices", nargs="+", default=None, help="slices to measure (default: all the rounds')")
    parser.add_argument("--eval", type=int, default=12, help="held-out prompts per slice")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0, help="the rounds benchmark's seed (the same held-out prompts)")
    add_output_arguments(parser, "served_ab")
    return parser.parse_args(argv)


def compare(target: Any, draft: Any, indexes: dict[str, Any], rows: dict[str, list[dict[str, str]]], params: Any,
            a: dict[str, Any], b: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """One repetition: per slice, plain decoding and the two settings as served (engine settings `a` and
    `b`, each beside its read-only index, `indexes["a"]` and `indexes["b"]`), prompt by prompt in turn."""
    from draftwheel.flows import report
    from draftwheel.flows.demo import identical, measure
    from draftwheel.serving.engine.engine import Engine

    engines = {"plain": (Engine(target), "autoregressive"),
               "a": (Engine(target, draft, suffix_index=indexes["a"], **a), "hybrid"),
               "b": (Engine(target, draft, suffix_index=indexes["b"], **b), "hybrid")}
    result = {}
    for name, prompts in rows.items():
        runs = measure(engines, prompts, params)
        plain = [c.stats for c in runs["plain"]]
        row: dict[str, Any] = {}
        for arm in ("a", "b"):
            figures = report.figures([c.stats for c in runs[arm]], plain)
            row[arm] = {"speedup": figures["speedup_vs_plain"], "mal": figures["mean_accepted_length"],
                        "identical": identical(runs[arm], runs["plain"])}
        row["b_over_a"] = row["b"]["speedup"] / row["a"]["speedup"]
        result[name] = row
    return result


def summary(repeats: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per slice, the repetitions' mean speed and MAL of each setting and of B ÷ A."""
    out = {}
    for name in repeats[0]:
        rows = [rep[name] for rep in repeats]
        out[name] = {f"{arm}_{key}": statistics.fmean(row[arm][key] for row in rows)
                     for arm in ("a", "b") for key in ("speedup", "mal")}
        out[name]["b_over_a"] = statistics.fmean(row["b_over_a"] for row in rows)
    return out


def table_text(means: dict[str, dict[str, float]]) -> str:
    lines = ["| slice | A as served (MAL) | B as served (MAL) | B ÷ A |", "|---|---|---|---|"]
    for name, m in means.items():
        lines.append(f"| {name} | {m['a_speedup']:.2f}x ({m['a_mal']:.2f}) | {m['b_speedup']:.2f}x "
                     f"({m['b_mal']:.2f}) | {m['b_over_a']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    a, b = parse_setting(args.a), parse_setting(args.b)
    if args.home:
        os.environ["DRAFTWHEEL_HOME"] = str(Path(args.home).resolve())
    from rounds import SLICES, held_out

    from draftwheel.flows.bootstrap_flow import bootstrap_prompts
    from draftwheel.home import apply_offline_defaults, logs_dir, models_dir, state_dir
    from draftwheel.serving.engine.params import SamplingParams
    from draftwheel.serving.engine.precision import resolve_dtype
    from draftwheel.serving.engine.reference import ensure_reference_target
    from draftwheel.serving.engine.suffix import ReadOnlyIndex, SuffixConfig, SuffixIndex, target_key
    from draftwheel.serving.loading import load_model

    (engine_a, index_a), (engine_b, index_b) = split_setting(a), split_setting(b)
    try:
        configs = {"a": SuffixConfig(**index_a), "b": SuffixConfig(**index_b)}
    except ValueError as error:
        raise SystemExit(f"setting suffix_{error}") from None
    slices = args.slices or list(SLICES)
    unknown = sorted(set(slices) - set(SLICES))
    if unknown:
        raise SystemExit(f"--slices: {', '.join(unknown)} not among {', '.join(SLICES)}")
    apply_offline_defaults()
    dtype = resolve_dtype("auto", "cpu")
    target = load_model(ensure_reference_target(models_dir()), "cpu", dtype)
    draft = load_model(args.draft, "cpu", dtype)
    logs = Path(args.logs) if args.logs else next(
        (d for d in (state_dir() / "rounds" / "logs", logs_dir()) if d.is_dir()), logs_dir())
    built = {"a": SuffixIndex.from_logs(logs, target_key(target.model_id), configs["a"])}
    built["b"] = built["a"] if configs["b"] == configs["a"] else SuffixIndex.from_logs(
        logs, target_key(target.model_id), configs["b"])
    held = held_out(args.eval, args.seed, set(bootstrap_prompts()))
    rows = {name: held[f"eval/{name}"] for name in slices}
    params = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=0.0, k=args.k)
    indexes = {arm: ReadOnlyIndex(index) for arm, index in built.items()}
    repeats = [compare(target, draft, indexes, rows, params, engine_a, engine_b) for _ in range(args.repeats)]
    means = summary(repeats)
    print(table_text(means))
    out = save("served_ab", {"a": a, "b": b, "draft": args.draft, "index_logs": str(logs),
                             "index_requests": built["a"].requests, "repeats": repeats, "mean": means}, args)
    print(f"wrote {out}")
    return means


if __name__ == "__main__":
    main()
