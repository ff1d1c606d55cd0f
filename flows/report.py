"""The demo's before/after table: per-slice figures, printed, and saved as JSON, markdown and a PNG.

`figures(spec, plain)` aggregates per-request stats (anything with the `RequestStats` fields) into
acceptance rate (accepted / drafted tokens), mean accepted length (tokens per verification step, bonus
included), tokens/s and speedup vs plain decoding of the same prompts on the same engine. The rest
formats those numbers; nothing here runs a model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

from draftwheel.serving.engine.acceptance import acceptance_rate, mean_accepted_length
from draftwheel.serving.engine.records import describe_shares

# (key, label, format); speedup and tokens/s come from wall time, the other two from token counts.
METRICS = [
    ("acceptance_rate", "acceptance rate", "{:.3f}"),
    ("mean_accepted_length", "mean accepted length", "{:.2f}"),
    ("tokens_per_s", "tokens/s", "{:.1f}"),
    ("speedup_vs_plain", "speedup vs plain", "{:.2f}x"),
]
PHASES = ("before", "after")


def figures(spec: Iterable[Any], plain: Iterable[Any]) -> dict[str, float]:
    """Token-weighted figures of speculative runs `spec` against plain runs `plain` of the same prompts."""
    spec, plain = list(spec), list(plain)
    if not spec or not plain:
        raise ValueError("figures: need at least one speculative and one plain request")
    drafted = sum(s.drafted_tokens for s in spec)
    accepted = sum(s.accepted_tokens for s in spec)
    steps = sum(s.verify_steps for s in spec)
    tokens_per_s = sum(s.generated_tokens for s in spec) / max(sum(s.latency_s for s in spec), 1e-9)
    plain_tokens_per_s = sum(s.generated_tokens for s in plain) / max(sum(s.latency_s for s in plain), 1e-9)
    return {
        "requests": len(spec),
        "acceptance_rate": acceptance_rate(accepted, drafted),
        "mean_accepted_length": mean_accepted_length(accepted, steps),
        "tokens_per_s": tokens_per_s,
        "plain_tokens_per_s": plain_tokens_per_s,
        "speedup_vs_plain": tokens_per_s / plain_tokens_per_s,
    }


def rows(results: dict[str, Any]) -> list[list[str]]:
    """[slice, metric, before, after, change] for every slice measured in both phases."""
    table = []
    # each slice as served (hybrid) first, then its draft alone
    order = lambda name: (name.removesuffix(SERVED), not name.endswith(SERVED))
    for slice_name in sorted(set(results["before"]) & set(results["after"]), key=order):
        before, after = results["before"][slice_name], results["after"][slice_name]
        for key, label, fmt in METRICS:
            change = (after[key] / before[key] - 1.0) if before[key] else float("nan")
            table.append([slice_name, label, fmt.format(before[key]), fmt.format(after[key]), f"{change:+.1%}"])
    return table


HEADER = ["slice", "metric", "before", "after", "change"]
SERVED = "/hybrid"
"""Suffix of the slices measured as `draftwheel serve` runs drafts by default (mode hybrid)."""


def unchanged(results: dict[str, Any]) -> bool:
    """The round kept its champion: "before" and "after" are one model, measured once (`flows.demo`)."""
    meta = results.get("meta", {})
    return "champion_before" in meta and meta.get("champion_before") == meta.get("champion_after")


def headline(results: dict[str, Any]) -> list[str]:
    """Per slice, the round's speed change as served first and the draft alone beside it, one line each:
    what a user of `draftwheel serve` gets, then the figure the draft reaches by itself. A round that
    kept its champion changed nothing: each figure once, marked so."""
    lines = []
    for name in sorted(s for s in set(results["before"]) & set(results["after"]) if not s.endswith(SERVED)):
        parts = []
        for label, key in (("as served", name + SERVED), ("draft alone", name)):
            if key in results["before"] and key in results["after"]:
                old, new = (results[phase][key]["speedup_vs_plain"] for phase in PHASES)
                same = [results[phase][key].get("greedy_identical") for phase in PHASES]
                if unchanged(results):
                    checked = f", greedy identical {same[0]}" if same[0] else ""
                    parts.append(f"{label} {old:.2f}x plain (champion unchanged{checked})")
                    continue
                checked = f", greedy identical {same[0]} and {same[1]}" if all(same) else ""
                parts.append(f"{label} {old:.2f}x -> {new:.2f}x plain ({new / old - 1.0:+.1%}{checked})")
        lines.append(f"{name}: " + "; ".join(parts))
    return lines


def served_steps(results: dict[str, Any]) -> list[str]:
    """Per slice as served, where the steps came from before and after the round (`steps_by_source`: the
    suffix index, the draft, plain steps; share of the steps x tokens each): the draft's own change
    reaches serving only on its share. A kept champion's, once."""
    lines = []
    phases = PHASES[:1] if unchanged(results) else PHASES
    for key in sorted(s for s in results["before"] if s.endswith(SERVED)):
        parts = [f"{phase} {describe_shares(results[phase][key]['steps_by_source'])}" for phase in phases
                 if results[phase].get(key, {}).get("steps_by_source")]
        if parts:
            lines.append(f"{key.removesuffix(SERVED)}: " + "; ".join(parts))
    return lines


def to_markdown(results: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in rows(results)]
    meta = results.get("meta", {})
    notes = [f"- {key}: {value}" for key, value in meta.items()]
    served = [f"- {line}" for line in headline(results)]
    steps = [f"- as served, steps by source (share x tokens each) on {line}" for line in served_steps(results)]
    return "\n".join(["# draftwheel demo: before / after", "", *served, *steps, "", *lines, "", *notes, ""])


def print_table(results: dict[str, Any]) -> None:
    """The table on the terminal (rich when it is installed, plain text otherwise)."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        widths = [max(len(str(r[i])) for r in [HEADER, *rows(results)]) for i in range(len(HEADER))]
        for row in [HEADER, *rows(results)]:
            print("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)))
        return
    table = Table(title="draftwheel demo: before / after (champion v%s -> v%s)" % (
        results.get("meta", {}).get("champion_before", "?"), results.get("meta", {}).get("champion_after", "?")))
    for name in HEADER:
        table.add_column(name, justify="left" if name in ("slice", "metric") else "right")
    previous = None
    for row in rows(results):
        table.add_row(*([row[0] if row[0] != previous else "", *row[1:]]))
        previous = row[0]
    Console().print(table)


def plot(results: dict[str, Any], path: str | Path) -> Path:
    """Grouped bars per slice, before vs after, one panel per metric; saved as PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    slices = sorted(set(results["before"]) & set(results["after"]))
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4 * len(METRICS), 3.6))
    x = np.arange(len(slices))
    for ax, (key, label, _fmt) in zip(axes, METRICS):
        for offset, phase in ((-0.2, "before"), (0.2, "after")):
            ax.bar(x + offset, [results[phase][s][key] for s in slices], width=0.4, label=phase)
        ax.set_xticks(x, slices)
        ax.set_title(label)
    axes[0].legend()
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def save(results: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """results.json, results.md and results.png under `out_dir`; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "results.json", "markdown": out_dir / "results.md", "plot": out_dir / "results.png"}
    paths["json"].write_text(json.dumps(results, indent=2))
    paths["markdown"].write_text(to_markdown(results))
    plot(results, paths["plot"])
    return paths
