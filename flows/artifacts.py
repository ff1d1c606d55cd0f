"""The flows' verdicts as Prefect artifacts, so the Prefect UI shows them beside each flow run.

- `draftwheel-gate` (markdown): the gate's decision on a flywheel attempt, every check's line (failed
  first) and the per-slice table with its intervals; `draftwheel-gate-slices` (table): that table as data.
- `draftwheel-shadow` (table): champion vs challenger on the shadow replay, overall and per slice: mean
  accepted length and modelled speed over plain decoding as served, and each draft alone.
- `draftwheel-monitor` (markdown): the monitor's verdict (trigger, held or nothing) with its reasons and
  the figures per slice it decided on.
- `draftwheel-demo` (markdown) and `draftwheel-demo-table` (table): the demo's before/after table.

Each kind has one fixed key, so the UI's Artifacts page groups a kind's versions across runs; the
artifact itself belongs to the flow run that made it. The rows and text are built by plain functions
(tested without Prefect); `publish_*` hands them to Prefect and must run inside a flow run. Nothing here
decides anything: it formats what the gate, the shadow report, the monitor and the demo produced.
"""

from __future__ import annotations

from typing import Any

from draftwheel.flows import report as demo_report

GATE_KEY = "draftwheel-gate"
GATE_SLICES_KEY = "draftwheel-gate-slices"
SHADOW_KEY = "draftwheel-shadow"
MONITOR_KEY = "draftwheel-monitor"
DEMO_KEY = "draftwheel-demo"
DEMO_TABLE_KEY = "draftwheel-demo-table"


def _pct(value: float) -> str:
    return f"{value:+.1%}"


def slice_rows(decision: dict[str, Any]) -> list[dict[str, Any]]:
    """The gate's per-slice table (`Decision.as_dict()["slices"]`) as rows: champion and challenger on the
    gated metric, the relative change with its interval, the tolerance, the rule and the verdict."""
    return [{"group": v["group"], "members": ", ".join(v["members"]), "n": v["n"], "rule": v["rule"],
             "metric": v["metric"], "champion": round(v["champion_mean"], 4),
             "challenger": round(v["challenger_mean"], 4), "change": _pct(v["relative_change"]),
             "ci_low": _pct(v["ci_low"]), "ci_high": _pct(v["ci_high"]), "tolerance": f"-{v['tolerance']:.0%}",
             "verdict": "ok" if v["ok"] else "VETO"} for v in decision.get("slices", [])]


def gate_markdown(decision: dict[str, Any], title: str) -> str:
    """The gate's decision: verdict, every check's line and the per-slice table."""
    verdict = "PROMOTE" if decision["promote"] else "reject"
    lines = [f"# Gate: {verdict}", "", title, ""]
    lines += [f"- {reason}" for reason in decision["reasons"]]
    rows = slice_rows(decision)
    if rows:
        lines += ["", f"Per slice: the gated metric ({rows[0]['metric'].replace('_', ' ')}) of each draft, the relative "
                      "change with its interval, and the verdict of the slice's rule against its tolerance."]
        header = ["group", "n", "rule", "champion", "challenger", "change", "ci_low", "ci_high", "tolerance",
                  "verdict"]
        lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(str(row[k]) for k in header) + " |" for row in rows]
    return "\n".join(lines) + "\n"


ARM_FIGURES = (("mean_accepted_length", "mal"), ("served_speedup", "speedup"))
"""(shadow report figure, column suffix): as served, and under `draft_alone` for each draft by itself."""


def shadow_rows(shadow_report: dict[str, Any]) -> list[dict[str, Any]]:
    """Champion vs challenger, overall then per slice: each figure as served and for the draft alone (where
    the replay ran the drafts alone too)."""
    groups = {"overall": shadow_report["overall"], **shadow_report.get("slices", {})}
    rows = []
    for name, figures in groups.items():
        row: dict[str, Any] = {"slice": name, "n": figures["n"]}
        for setting in ("served", "alone"):
            for key, label in ARM_FIGURES:
                for arm in ("champion", "challenger"):
                    source = figures[arm] if setting == "served" else figures[arm].get("draft_alone", {})
                    if key in source:
                        row[f"{arm}_{setting}_{label}"] = round(source[key], 3)
        rows.append(row)
    return rows


def monitor_markdown(summary: dict[str, Any], champion_version: str) -> str:
    """The monitor's verdict (`MonitorDecision.summary()`): what it decided, why, and the figures per slice."""
    verdict = "HELD" if summary["held"] else ("TRIGGER" if summary["trigger"] else "no trigger")
    lines = [f"# Monitor: {verdict}", "", f"champion v{champion_version}", ""]
    lines += [f"- {reason}" for reason in summary["reasons"]] or ["- every threshold met"]
    if summary["held"]:
        lines += ["", f"held: {summary['held']}"]
    names = sorted(set(summary["served_mal"]) | set(summary["acceptance"]), key=lambda n: (n != "overall", n))
    lines += ["", "| slice | as served: mean accepted length | requests | draft acceptance rate | requests |",
              "|---|---|---|---|---|"]
    for name in names:
        served = summary["served_mal"].get(name)
        rate = summary["acceptance"].get(name)
        lines.append(f"| {name} | {'-' if served is None else f'{served:.3f}'} | "
                     f"{summary['served_requests'].get(name, 0)} | {'-' if rate is None else f'{rate:.3f}'} | "
                     f"{summary['requests'].get(name, 0)} |")
    return "\n".join(lines) + "\n"


def demo_rows(results: dict[str, Any]) -> list[dict[str, str]]:
    """The demo's before/after table (`draftwheel.flows.report.rows`) as rows keyed by its header."""
    return [dict(zip(demo_report.HEADER, row)) for row in demo_report.rows(results)]


def publish_gate(decision: dict[str, Any], shadow_report: dict[str, Any] | None, title: str) -> None:
    """The gate's decision (markdown), its per-slice table and, with a shadow report, champion vs challenger."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    verdict = "promote" if decision["promote"] else "reject"
    create_markdown_artifact(gate_markdown(decision, title), key=GATE_KEY, description=f"{verdict}: {title}")
    if decision.get("slices"):
        create_table_artifact(slice_rows(decision), key=GATE_SLICES_KEY, description=f"per-slice gate: {title}")
    if shadow_report is not None:
        create_table_artifact(shadow_rows(shadow_report), key=SHADOW_KEY,
                              description=f"as served and draft alone: {title}")


def publish_monitor(summary: dict[str, Any], champion_version: str) -> None:
    from prefect.artifacts import create_markdown_artifact

    verdict = "held" if summary["held"] else ("trigger" if summary["trigger"] else "no trigger")
    create_markdown_artifact(monitor_markdown(summary, champion_version), key=MONITOR_KEY,
                             description=f"champion v{champion_version}: {verdict}")


def publish_demo(results: dict[str, Any]) -> None:
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    meta = results.get("meta", {})
    description = f"champion v{meta.get('champion_before', '?')} -> v{meta.get('champion_after', '?')}"
    create_markdown_artifact(demo_report.to_markdown(results), key=DEMO_KEY, description=description)
    create_table_artifact(demo_rows(results), key=DEMO_TABLE_KEY, description=description)
