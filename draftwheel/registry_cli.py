"""`draftwheel shadow | promote | rollback | status`: the registry side of the command line.

`shadow` replays champion vs challenger (serving.shadow) and applies the gate's decision to the
registry: a passing challenger gets the `challenger` alias (registered first when given as a dir) and,
with --promote, becomes `champion`. `promote V` and `rollback` move aliases by hand; `status` prints the
versions with their aliases and key tags. Heavy imports happen inside the commands so `--help` is fast.
Registry failures print one clear line and exit 1.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT_CHAMPION = "models:/draftwheel-draft@champion"
DEFAULT_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "shadow.yaml"
REJECTED_EXIT = 3  # the shadow run worked and the gate said no: scripts can tell it from an error (1)


def register(subparsers: Any) -> None:
    shadow = subparsers.add_parser("shadow", help="replay champion vs challenger and gate the challenger",
                                   description="Replay champion vs challenger and gate the challenger. Exit "
                                               f"status: 0 promote, {REJECTED_EXIT} reject, 1 error.")
    shadow.add_argument("--challenger", required=True, help="candidate: a model dir or models:/NAME/VERSION|@ALIAS")
    shadow.add_argument("--champion", default=DEFAULT_CHAMPION, help=f"baseline draft (default {DEFAULT_CHAMPION})")
    shadow.add_argument("--holdout", default=None, help="mined holdout dataset dir (default <state>/datasets/holdout)")
    shadow.add_argument("--target", default=None, help="target model (default: the reference target)")
    shadow.add_argument("--config", default=str(DEFAULT_CONFIG), help="ShadowConfig YAML")
    shadow.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field (repeatable)")
    shadow.add_argument("--out", required=True, help="report JSON path (the plot is written beside it)")
    shadow.add_argument("--promote", action="store_true", help="with a passing gate, make the challenger champion")
    shadow.add_argument("--no-tracking", action="store_true", help="do not log the run to MLflow")
    shadow.set_defaults(func=_shadow)

    promote = subparsers.add_parser("promote", help="make a registered version the champion (old one -> previous)")
    promote.add_argument("version")
    promote.set_defaults(func=_promote)

    rollback = subparsers.add_parser("rollback", help="swap champion and previous")
    rollback.set_defaults(func=_rollback)

    status = subparsers.add_parser("status", help="registered draft versions, aliases and key figures")
    status.add_argument("--json", action="store_true", help="print the rows as JSON")
    status.set_defaults(func=_status)


def _registry_command(action: Any) -> int:
    """Run an action; a registry error or a missing model becomes one line on stderr and exit code 1."""
    from draftwheel.tracking import RegistryError

    try:
        return action()
    except (RegistryError, FileNotFoundError) as exc:
        print(f"draftwheel: {exc}", file=sys.stderr)
        return 1


def report_summary(report: dict[str, Any], report_path: str | None = None) -> dict[str, Any]:
    """The compact form of a shadow report stored in the version's `shadow_report` tag."""
    overall = report["overall"]
    return {"promote": report["decision"]["promote"], "champion": report["champion"].get("version", ""),
            "n": overall["n"], "gain": overall["difference"], "champion_mal": overall["champion"]["mean"],
            "challenger_mal": overall["challenger"]["mean"], "lossless_mismatches": len(report["lossless"]["mismatches"]),
            "report": report_path or "", "created": report.get("created", time.time())}


def _candidate_tags(model_dir: str, report: dict[str, Any]) -> dict[str, Any]:
    """Registry tags for a candidate dir: the target it was shadowed on, plus its training provenance."""
    from training.common import read_training_info

    info = read_training_info(model_dir)
    return {"target_sha256": report["target"]["sha256"], "manifest_sha256": info.get("manifest_sha256", ""),
            "training_config": {"stage": info.get("stage", ""), "config": info.get("config", {})}}


def apply_decision(report: dict[str, Any], challenger: str, promote_now: bool,
                   report_path: str | None = None) -> dict[str, Any]:
    """Record a shadow result in the registry; returns {"version", "aliases"} (version None if not registered).

    A registry challenger always gets the report tag; a dir is registered only when the gate passed.
    Passing challengers get the `challenger` alias, and with `promote_now` become `champion`.
    """
    from draftwheel import tracking

    passed = report["decision"]["promote"]
    if challenger.startswith("models:/"):
        name, version, _ = tracking.parse_model_uri(challenger)
        version = report["challenger"].get("version") or version
    elif passed:
        name = tracking.DRAFT_MODEL
        version = tracking.register_draft(challenger, _candidate_tags(challenger, report), name=name)
    else:
        return {"version": None, "aliases": {}}
    tracking.set_version_tags(version, {"shadow_report": report_summary(report, report_path)}, name=name)
    if passed:
        tracking.set_alias(version, "challenger", name=name)
        if promote_now:
            tracking.promote(version, name=name)
    return {"version": version, "aliases": tracking.aliases(name)}


def _default_target() -> str:
    from draftwheel import home
    from serving.reference import ensure_reference_target

    return str(ensure_reference_target(home.models_dir()))


def print_report(report: dict[str, Any]) -> None:
    overall, diff = report["overall"], report["overall"]["difference"]
    print(f"shadow: {'PROMOTE' if report['decision']['promote'] else 'REJECT'}  n={overall['n']}  "
          f"gain {diff['mean']:+.4f} [{diff['ci_low']:+.4f}, {diff['ci_high']:+.4f}]")
    for arm in ("champion", "challenger"):
        figures = overall[arm]
        print(f"  {arm:<10} mean accepted length {figures['mean']:.3f}  acceptance {figures['acceptance_rate']:.3f}  "
              f"{figures['tokens_per_s']:.1f} tok/s")
    if "target_only_tokens_per_s" in overall:
        print(f"  target alone {overall['target_only_tokens_per_s']:.1f} tok/s")
    for reason in report["decision"]["reasons"]:
        print(f"  {reason}")


def _shadow(args: argparse.Namespace) -> int:
    from draftwheel import home
    from draftwheel.config import ConfigError, load_config
    from draftwheel.tracking import get_tracker
    from serving.shadow import ShadowConfig, run_shadow

    try:
        config = load_config(ShadowConfig, args.config, args.overrides)
    except ValueError as exc:  # __post_init__ names the field; report it like any config error
        raise ConfigError(str(exc)) from exc
    holdout = args.holdout or home.datasets_dir() / "holdout"
    if args.holdout is None and not Path(holdout).is_dir():
        holdout = None  # no mined data yet: the canary set alone (the gate still needs min_requests)
    target = args.target or _default_target()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    def action() -> int:
        report = run_shadow(args.champion, args.challenger, target, holdout, config,
                            tracker=get_tracker(not args.no_tracking), out=args.out)
        outcome = apply_decision(report, args.challenger, args.promote, args.out)
        print_report(report)
        print(f"report: {args.out}  registry: {json.dumps(outcome)}")
        return 0 if report["decision"]["promote"] else REJECTED_EXIT

    return _registry_command(action)


def _promote(args: argparse.Namespace) -> int:
    from draftwheel import tracking

    def action() -> int:
        print(json.dumps(tracking.promote(args.version)))
        return 0

    return _registry_command(action)


def _rollback(args: argparse.Namespace) -> int:
    from draftwheel import tracking

    def action() -> int:
        print(json.dumps(tracking.rollback()))
        return 0

    return _registry_command(action)


def status_rows(versions: list[dict[str, Any]]) -> list[dict[str, str]]:
    """Flatten registry versions into table rows: aliases, hashes and the shadow gain if any."""
    rows = []
    for v in versions:
        tags = v["tags"]
        shadow = json.loads(tags["shadow_report"]) if tags.get("shadow_report") else {}
        gain = shadow.get("gain", {})
        rows.append({
            "version": v["version"], "aliases": ",".join(v["aliases"]) or "-",
            "created": time.strftime("%Y-%m-%d %H:%M", time.gmtime(v["created"])),
            "weights": tags.get("weights_sha256", "")[:12], "target": tags.get("target_sha256", "")[:12] or "-",
            "shadow": (f"{'pass' if shadow['promote'] else 'fail'} {gain.get('mean', 0):+.3f} "
                       f"[{gain.get('ci_low', 0):+.3f},{gain.get('ci_high', 0):+.3f}] n={shadow.get('n', 0)}")
            if shadow else "-",
        })
    return rows


def format_table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return "(no versions registered)"
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(lines)


def _status(args: argparse.Namespace) -> int:
    from draftwheel import tracking

    def action() -> int:
        rows = status_rows(tracking.list_versions())
        print(json.dumps(rows, indent=2) if args.json else format_table(rows))
        return 0

    return _registry_command(action)
