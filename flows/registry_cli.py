"""`draftwheel shadow | promote | rollback | status`: the registry side of the command line.

`shadow` replays champion vs challenger (draftwheel.evaluation.shadow) and records the result through
`draftwheel.registry` (the same path the flows use): a challenger dir is registered with the shadow
summary, gets the `challenger` alias unless rejected and, with --promote, becomes `champion`. `promote V`
and `rollback` move aliases (checked, locked, all or nothing); `status` prints every version of every
registered model, then (text output only) the target commands given no `--target` use, the retained corpus
and the serving suffix index's size and hit rate from the
stats file `draftwheel serve` writes. Heavy imports happen inside the commands so `--help` is fast. Exit codes: 0 done,
1 registry unreachable or failing, 2 a refusal or bad input (one line naming what), 3 a rejected challenger.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from draftwheel import home
from draftwheel.cli_help import add_log_dir, flag_overrides
from draftwheel.config import SHIPPED_CONFIGS, add_override_arguments
from draftwheel.registry_names import CHAMPION_URI, DRAFT_MODEL, REGISTERED_MODELS, URI_PREFIX, model_for_kind
from draftwheel.serving.server.cli_flags import add_dtype, add_k, add_min_path_prob

DEFAULT_CONFIG = SHIPPED_CONFIGS / "shadow.yaml"
REJECTED_EXIT = 3  # the shadow run worked and the gate said no: scripts can tell it from an error (1)


def register(subparsers: Any) -> None:
    shadow = subparsers.add_parser("shadow", help="replay champion vs challenger and gate the challenger",
                                   description="Replay champion vs challenger and gate the challenger. Exit "
                                               f"status: 0 promote, {REJECTED_EXIT} reject, 1 error, 2 bad input.")
    shadow.add_argument("--challenger", required=True, help="candidate: a model dir or models:/NAME/VERSION|@ALIAS")
    shadow.add_argument("--champion", default=CHAMPION_URI, help=f"baseline draft (default {CHAMPION_URI})")
    shadow.add_argument("--holdout", default=None, help="mined holdout dataset dir (default: what `draftwheel mine` "
                                                        "writes, <state>/datasets/holdout)")
    shadow.add_argument("--target", default=None, help="target model (default: the one the champion was trained "
                                                      "for; with no champion, the reference target)")
    shadow.add_argument("--config", default=str(DEFAULT_CONFIG), help="ShadowConfig YAML")
    add_override_arguments(shadow, "min_requests=8")
    add_k(shadow, None)
    add_min_path_prob(shadow, None)
    add_dtype(shadow, None)
    add_log_dir(shadow, help="serving logs the as-served replay's suffix index is built from "
                             "(default: the config's suffix_logs, else $DRAFTWHEEL_HOME/logs)")
    shadow.add_argument("--out", default=None, help="report JSON path, the plot is written beside it "
                                                    "(default <state>/shadow/<UTC time>/report.json)")
    shadow.add_argument("--promote", action="store_true", help="with a passing gate, make the challenger champion")
    shadow.add_argument("--no-tracking", action="store_true", help="do not log the run to MLflow")
    shadow.set_defaults(func=_shadow)

    promote = subparsers.add_parser("promote", help="make a registered version the champion (old one -> previous)",
                                    description="Make VERSION the champion after checking serving would load it "
                                                "(files intact, trained for the champion's target or --target).")
    promote.add_argument("version")
    promote.add_argument("--model", default=DRAFT_MODEL, choices=REGISTERED_MODELS, help="registered model")
    promote.add_argument("--target", default=None, help="the target serving will use (default: the current "
                                                        "champion's target)")
    promote.set_defaults(func=_promote)

    rollback = subparsers.add_parser("rollback", help="swap champion and previous")
    rollback.add_argument("--model", default=DRAFT_MODEL, choices=REGISTERED_MODELS, help="registered model")
    rollback.set_defaults(func=_rollback)

    status = subparsers.add_parser("status", help="registered versions, aliases and key figures")
    status.add_argument("--json", action="store_true", help="print the rows as JSON")
    status.set_defaults(func=_status)


def _registry_command(action: Any) -> int:
    """Run an action: a refusal or unusable version is one line and exit 2, a registry failure exit 1
    (`draftwheel.exit_codes`)."""
    from draftwheel.exit_codes import FAILURE, USAGE
    from draftwheel.locks import LockedError
    from draftwheel.registry import PromotionRefused
    from draftwheel.tracking import ArtifactError, RegistryError

    try:
        return action()
    except (PromotionRefused, ArtifactError, FileNotFoundError) as exc:
        print(f"draftwheel: {exc}", file=sys.stderr)
        return USAGE
    except (RegistryError, LockedError) as exc:
        print(f"draftwheel: {exc}", file=sys.stderr)
        return FAILURE


def apply_decision(report: dict[str, Any], challenger: str, promote_now: bool,
                   report_path: str | None = None) -> dict[str, Any]:
    """Record a shadow result in the registry; returns {"version", "aliases"}.

    A dir is registered (passing or not, so `status` shows what was tried); a registry challenger gets
    the summary tag. Passing challengers get `challenger`, and with `promote_now` become `champion`.
    """
    from draftwheel import registry, tracking
    from draftwheel.training.common import read_training_info

    summary = registry.report_summary(report, report_path)
    if challenger.startswith(URI_PREFIX):
        name, version, _ = tracking.parse_model_uri(challenger)
        version = report["challenger"].get("version") or version
        registry.record_shadow(version, summary, name=name)
    else:
        from draftwheel.serving.engine.models import draft_kind

        kind = draft_kind(challenger)
        name = model_for_kind(kind)
        from draftwheel.serving.loading import target_tags

        sha = report["target"]["sha256"]
        tags = registry.candidate_tags(read_training_info(challenger), sha, **target_tags(report["target"]["spec"], sha))
        version = registry.record_candidate(challenger, kind, tags, summary)
    if summary["promote"] and promote_now:
        registry.promote(version, name=name, target_sha=report["target"]["sha256"],
                         gated_against=report["champion"].get("version") or None)
    return {"version": version, "aliases": tracking.aliases(name)}


def print_report(report: dict[str, Any]) -> None:
    overall, diff = report["overall"], report["overall"]["difference"]
    print(f"shadow: {'PROMOTE' if report['decision']['promote'] else 'REJECT'}  n={overall['n']}  "
          f"gain {diff['mean']:+.4f} [{diff['ci_low']:+.4f}, {diff['ci_high']:+.4f}]")
    for arm in ("champion", "challenger"):
        figures = overall[arm]
        print(f"  {arm:<10} mean accepted length {figures['mean']:.3f}  acceptance {figures['acceptance_rate']:.3f}  "
              f"{figures['tokens_per_s']:.1f} tok/s")
    for reason in report["decision"]["reasons"]:
        print(f"  {reason}")


SHADOW_FLAG_FIELDS = {"k": "k", "min_path_prob": "min_path_prob", "dtype": "dtype", "log_dir": "suffix_logs"}
"""`shadow`'s serving flags and the ShadowConfig fields they set (the flags win over the overrides)."""


def _shadow(args: argparse.Namespace) -> int:
    from draftwheel import home
    from draftwheel.config import load_config
    from draftwheel.tracking import get_tracker
    from draftwheel.evaluation.shadow import ShadowConfig, run_shadow

    config = load_config(ShadowConfig, args.config, flag_overrides(args, SHADOW_FLAG_FIELDS))
    holdout = args.holdout or home.mined_dataset("holdout")
    if args.holdout is None and not Path(holdout).is_dir():
        holdout = None  # no mined data yet: the canary set alone (the gate still needs min_requests)
    args.out = args.out or str(home.timestamped_dir("shadow") / "report.json")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")

    def action() -> int:
        from draftwheel.serving.loading import resolve_target

        target = resolve_target(args.target, args.champion)
        report = run_shadow(args.champion, args.challenger, target, holdout, config,
                            tracker=get_tracker(not args.no_tracking), out=args.out)
        outcome = apply_decision(report, args.challenger, args.promote, args.out)
        print_report(report)
        print(f"report: {args.out}  registry: {json.dumps(outcome)}")
        return 0 if report["decision"]["promote"] else REJECTED_EXIT

    return _registry_command(action)


def _target_sha(target: str | None) -> str | None:
    if target is None:
        return None
    from draftwheel.hashing import weights_sha256

    if not Path(target).is_dir():
        raise FileNotFoundError(f"--target {target}: not a model directory")
    return weights_sha256(target)


def _promote(args: argparse.Namespace) -> int:
    from draftwheel import registry

    def action() -> int:
        print(json.dumps(registry.promote(args.version, args.model, target_sha=_target_sha(args.target))))
        return 0

    return _registry_command(action)


def _rollback(args: argparse.Namespace) -> int:
    from draftwheel import registry

    def action() -> int:
        print(json.dumps(registry.rollback(args.model)))
        return 0

    return _registry_command(action)


def suffix_index_line(root: str | Path | None = None) -> str:
    """One line on the serving suffix index, from the stats file the server writes
    ($DRAFTWHEEL_HOME/serving/suffix_stats.json; draftwheel.serving.server.serving_state)."""
    import time

    from draftwheel.serving.server.serving_state import read_suffix_stats

    stats = read_suffix_stats(root)
    if stats is None:
        return "suffix index: none written (serve with suffix_tier: true)"
    age = time.time() - stats.get("written", 0.0)
    return (f"suffix index: {stats['requests']} requests, {stats['tokens']} tokens; hit rate "
            f"{stats['hit_rate']:.1%} of {stats['served_steps']} steps in {stats['served_requests']} suffix/hybrid "
            f"requests, suffix drafts accepted {stats['suffix_acceptance_rate']:.1%} (written {age:.0f} s ago)")


def corpus_line() -> str:
    """One line on the flywheel's retained corpus (draftwheel.mining.corpus): rows per slice, and where the
    next round's traffic starts."""
    from draftwheel.mining.config import format_time
    from draftwheel.mining.corpus import mined_until, sizes

    rows = sizes(home.state_dir() / "corpus")
    if not rows:
        return "retained corpus: empty (a flywheel round adds its mined rows)"
    line = f"retained corpus: {sum(rows.values())} rows (" + ", ".join(f"{k} {v}" for k, v in rows.items()) + ")"
    newest = mined_until(home.state_dir() / "corpus")
    if newest is not None:
        line += f"; the next round mines the traffic logged after {format_time(newest)}"
    return line


def target_line() -> str:
    """One line on the target every command given no `--target` uses: the one the champion was trained for,
    as the registry recorded it, else the reference target (`draftwheel.serving.loading.resolve_target`)."""
    from draftwheel.serving.loading import TargetGoneError, resolve_target

    try:
        return f"target (commands given no --target): {resolve_target(convert_reference=False)}"
    except TargetGoneError as exc:
        return f"target (commands given no --target): {exc}"


def _status(args: argparse.Namespace) -> int:
    from draftwheel import registry

    def action() -> int:
        rows = registry.status_rows()
        print(json.dumps(rows, indent=2) if args.json else registry.format_table(rows))
        if not args.json:
            print(target_line())
            print(corpus_line())
            print(suffix_index_line())
        return 0

    return _registry_command(action)
