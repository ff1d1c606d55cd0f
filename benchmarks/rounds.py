"""Rounds of the flywheel on a drifting mixed stream: does every round make serving faster, as served?

Each round r = 1..R:
1. serves fresh traffic through the champion as `draftwheel serve` runs it (mode hybrid, beside a suffix
   index that learns from every finished request), `--requests` per active slice, the slices taking
   turns: chat, code and sql throughout, tools (a new templated slice) from round `--new-slice-at` on;
2. runs one unattended `monitor` (its threshold is acceptance 1.0, so it always triggers the flywheel:
   mine -> train -> shadow, as served -> promote, retry included);
3. measures the champion it ends with on fixed held-out prompts per slice, never served and never
   trained on: plain decoding, as served (hybrid beside a read-only index of all the traffic served so
   far, and from the serving engine's step paces: whether drafting pays per slice, as the serving process
   has measured it on the traffic, a copy), the draft alone and the index alone (mode suffix), prompt by
   prompt in turn, so every speedup is against plain decoding of the same prompts in the same run;
   `served/best` is as served over the better of its two parts, and each slice's as-served steps are
   split by source (the index, the draft, plain steps: share x tokens each). Greedy outputs are compared
   with plain decoding's.
Round 0 is the bootstrap v0 before any round. The per-round table is printed, saved as rounds.json under
the state dir and logged to MLflow (metrics per round and slice, a plot).

The arm is set by the trainer's overrides: `--residual-floor 1.0` trains every position alike (uniform
weighting), the ablation of the default residual weighting. Run each arm in its own state dir
(`--home`); each bootstraps its v0 once: the demo's quick bootstrap, or with `--bootstrap full` the v0 that
`draftwheel bootstrap` trains (a state dir that already has a champion starts from it).

    .venv/bin/python benchmarks/rounds.py --home rounds-residual
    .venv/bin/python benchmarks/rounds.py --home rounds-uniform --residual-floor 1.0
    .venv/bin/python benchmarks/rounds.py --home rounds-full --bootstrap full
Four rounds take about 45 minutes on 2 CPU cores; each round prints its time, and the part of it before
the held-out measurement (serving, the monitor, the flywheel: what a deployment pays).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

SLICES = ("chat", "code", "sql", "tools")
CHAT_HELD_OUT = Path(__file__).resolve().parent / "prompts" / "chat_heldout.jsonl"
NEW_SLICE = "tools"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--home", required=True, help="the state dir of this arm ($DRAFTWHEEL_HOME)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--requests", type=int, default=16, help="served requests per active slice per round")
    parser.add_argument("--chat-requests", type=int, default=8,
                        help="chat requests per round (the chat workload has few prompts the v0 did not learn from)")
    parser.add_argument("--eval", type=int, default=8, help="held-out prompts per slice")
    parser.add_argument("--new-slice-at", type=int, default=3, help="the round the tools slice first appears")
    parser.add_argument("--max-new-tokens", type=int, default=40)
    parser.add_argument("--residual-floor", type=float, default=None,
                        help="the eagle trainer's residual_floor (default: configs/eagle.yaml's; 1.0 = uniform)")
    parser.add_argument("--train-set", action="append", default=[], metavar="KEY=VALUE",
                        help="more overrides for the trainer (e.g. epochs=4)")
    parser.add_argument("--bootstrap", choices=("quick", "full"), default="quick",
                        help="the v0: quick = the demo's (~6 min), full = `draftwheel bootstrap`'s configs/bootstrap.yaml "
                             "(~18 min, stronger on chat)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def held_out(n: int, seed: int, seen: set[str]) -> dict[str, list[dict[str, str]]]:
    """n held-out prompts per slice ("eval/<slice>"), none in `seen` (which gains them): chat from the
    prompts file no draft was trained on, the others fresh from the workloads."""
    from draftwheel.flows.demo import fresh_prompts

    rows = {}
    for name in SLICES:
        if name == "chat" and CHAT_HELD_OUT.is_file():
            rows["eval/chat"] = [{"prompt": json.loads(line)["prompt"], "slice": "chat"}
                                 for line in CHAT_HELD_OUT.read_text().splitlines()[:n]]
        else:
            rows[f"eval/{name}"] = fresh_prompts(name, n, seed + 1000, seen)
        seen |= {row["prompt"] for row in rows[f"eval/{name}"]}
    return rows


def prompts(args: argparse.Namespace, exclude: set[str]) -> dict[str, Any]:
    """Held-out prompts per slice, then each round's traffic: all distinct, none in `exclude`."""
    from draftwheel.flows.demo import fresh_prompts

    seen = set(exclude)
    rows = held_out(args.eval, args.seed, seen)
    for r in range(1, args.rounds + 1):
        active = [s for s in SLICES if s != NEW_SLICE or r >= args.new_slice_at]
        by_slice = []
        for name in active:
            n = args.chat_requests if name == "chat" else args.requests
            by_slice.append(fresh_prompts(name, n, args.seed + r, seen))
            seen |= {row["prompt"] for row in by_slice[-1]}
        rows[f"round/{r}"] = interleave(by_slice)
    return rows


def interleave(streams: list[list[dict[str, str]]]) -> list[dict[str, str]]:
    """One mixed stream, the slices taking turns: as traffic arrives, so the round's hold-out (its latest
    requests) holds every slice, not only the last one served."""
    mixed = []
    for turn in range(max(map(len, streams), default=0)):
        mixed += [stream[turn] for stream in streams if turn < len(stream)]
    return mixed


def figures(runs: dict[str, list[Any]]) -> dict[str, Any]:
    """One slice's row: the champion as served, the draft alone and the suffix index alone, each against
    plain decoding of the same prompts; and as served over the better of its two parts."""
    from draftwheel.flows import report
    from draftwheel.flows.demo import identical
    from draftwheel.serving.engine.records import source_counts, source_shares

    plain = [c.stats for c in runs["plain"]]
    served, alone, suffix = (report.figures([c.stats for c in runs[arm]], plain)
                             for arm in ("served", "alone", "suffix"))
    best_part = max(alone["speedup_vs_plain"], suffix["speedup_vs_plain"])
    return {"served_speedup": served["speedup_vs_plain"], "served_mal": served["mean_accepted_length"],
            "alone_speedup": alone["speedup_vs_plain"], "alone_mal": alone["mean_accepted_length"],
            # (no MAL for the index alone: its loop records the prompt's forward as a step, the others do not)
            "suffix_speedup": suffix["speedup_vs_plain"],
            "served_over_best_part": served["speedup_vs_plain"] / best_part,
            "identical": ", ".join(f"{identical(runs[arm], runs['plain'])} {arm}" for arm in ("served", "alone", "suffix")),
            # where the as-served steps came from: the draft's gain reaches serving only on its share
            "served_steps": source_shares(source_counts(c.record for c in runs["served"])),
            "n": len(plain)}


def measure_round(plain: Any, champion: Any, logs: Path, rows: dict[str, Any], params: Any,
                  cut: float, paces: Any = None) -> dict[str, dict[str, Any]]:
    """Per slice: the champion as served (beside a read-only index of the logs, and from a copy of
    `paces`, the serving engine's step paces, as the serving process would decode the next request),
    the draft alone and the index alone, against plain decoding, on the held-out prompts, taking the four
    in turn prompt by prompt (draftwheel.flows.demo.measure)."""
    from draftwheel.flows.demo import measure
    from draftwheel.serving.engine.engine import Engine
    from draftwheel.serving.engine.suffix import ReadOnlyIndex, SuffixIndex, target_key

    target = plain.target
    index = ReadOnlyIndex(SuffixIndex.from_logs(logs, target_key(target.model_id)))
    engines = {"plain": (plain, "autoregressive"),
               "served": (Engine(target, champion, min_path_prob=cut, suffix_index=index), "hybrid"),
               "alone": (Engine(target, champion, min_path_prob=cut), "draft"),
               "suffix": (Engine(target, suffix_index=index), "suffix")}
    if paces is not None:
        engines["served"][0].paces = paces.copy()
    return {name: figures(measure(engines, rows[f"eval/{name}"], params)) for name in SLICES}


def gate_summary(report_path: str | None) -> dict[str, Any]:
    """The round's challenger against its champion in the gate's replay (whether promoted or not): the
    relative change as served (the gated metric, with its interval) and of the draft alone's mean
    accepted length, over all replayed prompts."""
    if not report_path or not Path(report_path).is_file():
        return {}
    report = json.loads(Path(report_path).read_text())
    overall = report["overall"]
    alone = [overall[arm].get("draft_alone", {}).get("mean_accepted_length") for arm in ("champion", "challenger")]
    return {"served_change": overall["relative"]["mean"], "served_ci": [overall["relative"]["ci_low"],
                                                                       overall["relative"]["ci_high"]],
            "alone_mal_change": alone[1] / alone[0] - 1.0 if all(alone) else None}


def pooled(row: dict[str, dict[str, Any]], key: str) -> float:
    """The mean of a figure over the slices measured (each slice weighs alike)."""
    return sum(figs[key] for figs in row.values()) / len(row)


def table(rounds: list[dict[str, Any]]) -> str:
    from draftwheel.serving.engine.records import describe_shares

    lines = [f"{'round':>5} {'champion':>8} {'slice':<7} {'served':>7} {'alone':>7} {'suffix':>7} {'served/best':>11} "
             f"{'served MAL':>10} {'alone MAL':>9}  greedy identical"]
    for r in rounds:
        for name, f in r["slices"].items():
            lines.append(f"{r['round']:>5} {r['champion']:>8} {name:<7} {f['served_speedup']:>6.2f}x "
                         f"{f['alone_speedup']:>6.2f}x {f['suffix_speedup']:>6.2f}x {f['served_over_best_part']:>10.2f}x "
                         f"{f['served_mal']:>10.2f} {f['alone_mal']:>9.2f}  {f['identical']}")
        for name, f in r["slices"].items():
            if f.get("served_steps"):
                lines.append(f"{'':>14} {name} as served, steps (share x tokens each): "
                             f"{describe_shares(f['served_steps'])}")
        gate = r.get("gate") or {}
        challenger = (f"; its challenger in the gate: as served {gate['served_change']:+.1%} "
                      f"[{gate['served_ci'][0]:+.1%}, {gate['served_ci'][1]:+.1%}], draft alone MAL "
                      f"{gate['alone_mal_change']:+.1%}") if gate.get("alone_mal_change") is not None else ""
        lines.append(f"{r['round']:>5} {r['champion']:>8} {'pooled':<7} {pooled(r['slices'], 'served_speedup'):>6.2f}x "
                     f"{pooled(r['slices'], 'alone_speedup'):>6.2f}x   ({r.get('seconds', 0):.0f} s, "
                     f"{r.get('loop_seconds', 0):.0f} s before the held-out measurement: "
                     f"{r.get('outcome', 'before any round')}{challenger})")
    return "\n".join(lines)


def plot(rounds: list[dict[str, Any]], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    x = [r["round"] for r in rounds]
    for ax, key, title in ((axes[0], "served_speedup", "as served (hybrid)"), (axes[1], "alone_speedup", "draft alone")):
        for name in SLICES:
            ax.plot(x, [r["slices"][name][key] for r in rounds], marker="o", label=name)
        ax.set_title(title)
        ax.set_xlabel("round")
        ax.axhline(1.0, color="grey", lw=0.8)
    axes[0].set_ylabel("speed vs plain decoding (same run)")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from draftwheel import home
    from draftwheel.registry_names import CHAMPION_URI
    from draftwheel.flows.bootstrap_flow import bootstrap_flow, bootstrap_prompts
    from draftwheel.flows.demo import DemoConfig, DemoRun, monitor_overrides
    from draftwheel.flows.flywheel import override
    from draftwheel.flows.monitor import monitor
    from draftwheel.flows import tasks
    from draftwheel.serving.engine.engine import Engine
    from draftwheel.serving.loading import load_model
    from draftwheel.serving.engine.params import SamplingParams
    from draftwheel.serving.engine.precision import resolve_dtype
    from draftwheel.serving.engine.suffix import SuffixIndex, target_key

    train = [*DemoConfig().train_overrides, *args.train_set]
    if args.residual_floor is not None:
        train.append(f"residual_floor={args.residual_floor}")
    config = DemoConfig(max_new_tokens=args.max_new_tokens, code_requests=args.requests * len(SLICES),
                        train_overrides=train, seed=args.seed)
    bootstrap_flow(overrides=config.bootstrap_overrides if args.bootstrap == "quick" else [])
    target = tasks.resolve_target("")
    loaded = load_model(target["dir"])
    serving = Engine(loaded, load_model(CHAMPION_URI), dtype=resolve_dtype(config.dtype),
                     min_path_prob=config.min_path_prob, suffix_index=SuffixIndex(target_key(loaded.model_id)))
    plain = Engine(loaded, dtype=resolve_dtype(config.dtype))
    run_ = DemoRun(config, home.state_dir() / "rounds")
    run_.engine = serving
    run_.params = SamplingParams(max_new_tokens=config.max_new_tokens, k=config.k, seed=config.seed)
    rows = prompts(args, bootstrap_prompts())
    rounds = [{"round": 0, "champion": serving.draft.model_id.version,
               "slices": measure_round(plain, serving.draft, run_.logs_dir, rows, run_.params, config.min_path_prob)}]
    print(table(rounds), flush=True)
    for r in range(1, args.rounds + 1):
        started = time.perf_counter()
        print(f"\n=== round {r}: serve {len(rows[f'round/{r}'])} requests, then one unattended monitor ===", flush=True)
        run_.serve(rows[f"round/{r}"])
        # acceptance 1.0: the monitor always triggers, so every round runs the flywheel
        outcome = monitor(None, [*monitor_overrides(config, run_.logs_dir, 1.0, run_flywheel=True),
                                 override("retrigger_after_requests", 0)])
        result = outcome.get("flywheel") or {}
        looped = time.perf_counter() - started  # what a deployment pays: serving, the monitor, the flywheel
        serving.swap_draft(load_model(CHAMPION_URI))
        rounds.append({"round": r, "champion": serving.draft.model_id.version,
                       "outcome": "promoted" if result.get("promoted") else "rejected",
                       "decision": (result.get("decision") or {}).get("reasons"),
                       "gate": gate_summary(result.get("report_path")),
                       "slices": measure_round(plain, serving.draft, run_.logs_dir, rows, run_.params,
                                               config.min_path_prob, serving.paces)})
        rounds[-1].update(seconds=time.perf_counter() - started, loop_seconds=looped)
        print(table(rounds), flush=True)
    return rounds


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    os.environ["DRAFTWHEEL_HOME"] = str(Path(args.home).resolve())
    from draftwheel.home import apply_offline_defaults, state_dir

    apply_offline_defaults()
    started = time.perf_counter()
    rounds = run(args)
    out = state_dir() / "rounds"
    out.mkdir(parents=True, exist_ok=True)
    (out / "rounds.json").write_text(json.dumps({"args": vars(args), "rounds": rounds}, indent=2))
    png = plot(rounds, out / "rounds.png")
    _log(args, rounds, [out / "rounds.json", png])
    print(f"\n{table(rounds)}\n\nwall time {time.perf_counter() - started:.0f} s; {out / 'rounds.json'}")


def _log(args: argparse.Namespace, rounds: list[dict[str, Any]], files: list[Path]) -> None:
    from draftwheel.tracking import get_tracker

    tracker = get_tracker(True)
    with tracker.run("rounds", tags={"benchmark": "rounds"}):
        tracker.log_params({k: str(v) for k, v in vars(args).items()})
        for r in rounds:
            metrics = {f"{name}.{key}": figs[key] for name, figs in r["slices"].items()
                       for key in ("served_speedup", "alone_speedup", "suffix_speedup", "served_over_best_part",
                                   "served_mal", "alone_mal")}
            metrics["pooled.served_speedup"] = pooled(r["slices"], "served_speedup")
            metrics.update({key: r[key] for key in ("seconds", "loop_seconds") if key in r})
            tracker.log_metrics(metrics, step=r["round"])
        for path in files:
            tracker.log_artifact(path)


if __name__ == "__main__":
    main()
