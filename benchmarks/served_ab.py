"""Two serving settings side by side, as served: which makes `draftwheel serve` faster on held-out traffic?

One draft, the suffix index over the serving logs (as `serve` would have it, read-only), and per slice
the rounds benchmark's held-out prompts (chat never trained on; fresh code, sql and tools). Every prompt
is decoded plain, with setting A and with setting B (mode hybrid, greedy), in turn, so a change in the
machine's load hits all three alike; `--repeats` runs the whole comparison again, because the hybrid's
choices follow measured step times and so differ a little from run to run. Reported per slice and
repetition: speed against plain decoding and mean accepted length of each setting, greedy identity,
and B ÷ A; then the repetitions' mean.

Settings are engine settings of configs/serve.yaml's names: `runner_up` (verify the draft's second
choice for its first token beside its chain), `index_branch` (verify the index's proposal
beside the draft's chain as one token tree) and `min_path_prob` (the chain cut); and the suffix index's
(`draftwheel.serving.engine.suffix.SuffixConfig`, prefixed `suffix_`): `suffix_spec_factor`,
`suffix_spec_offset` (how long a proposal a match of a given length may make), `suffix_stretch_factor`
(how far past that it offers tokens the loop verifies where they pay), `suffix_min_token_prob`.
An arm whose index settings differ gets its own index over the same logs.

    .venv/bin/python benchmarks/served_ab.py --home DIR --a index_branch=false --b index_branch=true --repeats 2

With `--modelled-time` the hybrid's choices read step times from a cost model measured once at the
start (the target's verify cost by rows on this machine, the draft's cost per drafted token from one
draft-alone warm-up request: `draftwheel.serving.engine.adaptive.ModelledTime`) instead of the clock, so
each arm decodes every prompt along the same steps in every repetition; each arm's speed is then also
given by the same cost model (`modelled`, as the shadow gate computes it), beside the wall clock's.

The result is printed, saved as JSON under the state dir and logged to MLflow (bench_io).
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path
from typing import Any

from bench_io import add_output_arguments, save  # benchmarks/ is on sys.path when run as a script

def _flag(text: str) -> bool:
    return {"true": True, "false": False}[text.lower()]


SETTINGS = {"index_branch": _flag, "runner_up": _flag, "min_path_prob": float,
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
    parser.add_argument("--modelled-time", action="store_true",
                        help="choices and a second speed figure by a cost model measured once (module docstring)")
    add_output_arguments(parser, "served_ab")
    return parser.parse_args(argv)


def cost_model(target: Any, draft: Any, prompt: str, params: Any) -> dict[str, Any]:
    """The cost model `--modelled-time` decides and measures by: the target's verify cost by rows (up to
    the longest token tree a step may verify) and the draft's c from one draft-alone request, measured
    on the engine's own (packed) kernels."""
    from draftwheel.evaluation.served_cost import measure_row_costs, modelled_time
    from draftwheel.serving.engine.engine import Engine
    from draftwheel.serving.engine.suffix import SuffixConfig

    engine = Engine(target, draft)
    row_costs, _ = measure_row_costs(target.model, params.k + SuffixConfig().max_spec_tokens + 1)
    time = modelled_time(row_costs, engine.generate([prompt], params, chat=True, mode="draft")[0])
    return {"time": time, "row_costs": row_costs, "c": time.draft_c}


def modelled_speedup(completions: list[Any], row_costs: list[float], c: float) -> float:
    """The completions' tokens per unit of plain-step cost, all together (the gate's served_speedup)."""
    from draftwheel.evaluation.served_cost import StepCost, served_speedup

    costs = [StepCost.of(done.record.steps, row_costs, done.record.mode) for done in completions]
    return served_speedup(StepCost(tokens=sum(cost.tokens for cost in costs),
                                   verify_cost=sum(cost.verify_cost for cost in costs),
                                   model_drafted=sum(cost.model_drafted for cost in costs)), c)


def compare(target: Any, draft: Any, indexes: dict[str, Any], rows: dict[str, list[dict[str, str]]], params: Any,
            a: dict[str, Any], b: dict[str, Any], model: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """One repetition: per slice, plain decoding and the two settings as served (engine settings `a` and
    `b`, each beside its read-only index, `indexes["a"]` and `indexes["b"]`), prompt by prompt in turn.
    With `model` (`cost_model`), the arms decide by its modelled time and get its speed too."""
    from draftwheel.flows import report
    from draftwheel.flows.demo import identical, measure
    from draftwheel.serving.engine.engine import Engine

    timing = {"modelled_time": model["time"]} if model else {}
    engines = {"plain": (Engine(target), "autoregressive"),
               "a": (Engine(target, draft, suffix_index=indexes["a"], **a, **timing), "hybrid"),
               "b": (Engine(target, draft, suffix_index=indexes["b"], **b, **timing), "hybrid")}
    result = {}
    for name, prompts in rows.items():
        runs = measure(engines, prompts, params)
        plain = [c.stats for c in runs["plain"]]
        row: dict[str, Any] = {}
        for arm in ("a", "b"):
            figures = report.figures([c.stats for c in runs[arm]], plain)
            row[arm] = {"speedup": figures["speedup_vs_plain"], "mal": figures["mean_accepted_length"],
                        "identical": identical(runs[arm], runs["plain"])}
            if model:
                row[arm]["modelled"] = modelled_speedup(runs[arm], model["row_costs"], model["c"])
        row["b_over_a"] = row["b"]["speedup"] / row["a"]["speedup"]
        if model:
            row["b_over_a_modelled"] = row["b"]["modelled"] / row["a"]["modelled"]
        result[name] = row
    return result


def summary(repeats: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per slice, the repetitions' mean speed and MAL of each setting and of B ÷ A."""
    out = {}
    for name in repeats[0]:
        rows = [rep[name] for rep in repeats]
        keys = ("speedup", "mal") + (("modelled",) if "modelled" in rows[0]["a"] else ())
        out[name] = {f"{arm}_{key}": statistics.fmean(row[arm][key] for row in rows)
                     for arm in ("a", "b") for key in keys}
        for ratio in ("b_over_a", "b_over_a_modelled"):
            if ratio in rows[0]:
                out[name][ratio] = statistics.fmean(row[ratio] for row in rows)
    return out


def table_text(means: dict[str, dict[str, float]]) -> str:
    modelled = all("b_over_a_modelled" in m for m in means.values())
    lines = ["| slice | A as served (MAL) | B as served (MAL) | B ÷ A |"
             + (" A, B modelled | B ÷ A modelled |" if modelled else ""),
             "|---|---|---|---|" + ("---|---|" if modelled else "")]
    for name, m in means.items():
        line = (f"| {name} | {m['a_speedup']:.2f}x ({m['a_mal']:.2f}) | {m['b_speedup']:.2f}x "
                f"({m['b_mal']:.2f}) | {m['b_over_a']:.3f} |")
        if modelled:
            line += f" {m['a_modelled']:.2f}x, {m['b_modelled']:.2f}x | {m['b_over_a_modelled']:.3f} |"
        lines.append(line)
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
    model = cost_model(target, draft, next(iter(rows.values()))[0]["prompt"], params) if args.modelled_time else None
    if model:
        print(f"modelled time: verify row slope {model['time'].row_slope:.4f} of a step, draft c {model['c']:.4f}")
    repeats = [compare(target, draft, indexes, rows, params, engine_a, engine_b, model)
               for _ in range(args.repeats)]
    means = summary(repeats)
    print(table_text(means))
    out = save("served_ab", {"a": a, "b": b, "draft": args.draft, "index_logs": str(logs),
                             "index_requests": built["a"].requests,
                             "cost_model": {"row_costs": model["row_costs"], "c": model["c"]} if model else None,
                             "repeats": repeats, "mean": means}, args)
    print(f"wrote {out}")
    return means


if __name__ == "__main__":
    main()
