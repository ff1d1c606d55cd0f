"""`draftwheel flywheel | monitor | demo`: the Prefect flows from the command line.

Without `--schedule` a command runs its flow once (against Prefect's temporary local server unless
PREFECT_API_URL points at a real one). With `--schedule CRON` it serves a Prefect deployment that a
running `prefect server start` triggers on that schedule. Prefect, torch and MLflow are imported inside
the command functions so `draftwheel --help` stays fast. Exit codes follow `draftwheel.exit_codes`: 2 for a
config or setup the user can fix (checked before anything runs), 1 when a stage failed or another run holds
the lock.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from draftwheel.cli_help import add_log_dir, examples, flag_overrides
from draftwheel.config import add_override_arguments
from draftwheel.exit_codes import FAILURE, USAGE
from draftwheel.serving.server.cli_flags import add_dtype, add_k, add_min_path_prob


SCHEDULE_HELP = "serve a deployment on this cron schedule (needs `prefect server start` and PREFECT_API_URL)"
# Flags that stand for a config field (the flag name -> the field): applied as overrides after `--set`, so
# they win, and a scheduled deployment gets them with the rest of its overrides.
FLAG_FIELDS = {"log_dir": "logs_dir", "k": "k", "min_path_prob": "min_path_prob", "dtype": "dtype"}


def _add_config_args(parser: argparse.ArgumentParser, default_file: str, example: str) -> None:
    parser.add_argument("--config", default=None, metavar="FILE",
                        help=f"YAML config (e.g. {default_file}); default: the built-in defaults, which it mirrors")
    add_override_arguments(parser, example)


def register(subparsers: Any) -> None:
    flywheel = subparsers.add_parser(
        "flywheel", help="one turn of mine -> train -> shadow -> promote (Prefect flow)",
        description="One turn of the flywheel as a Prefect flow: mine the serving logs, train a candidate from "
                    "the champion, shadow-replay champion vs candidate, register it with the gate's verdict "
                    "and promote it if the gate passed. --schedule serves it as a deployment instead.",
        **examples("draftwheel flywheel trainer=dpo",
                   "draftwheel flywheel --log-dir /tmp/draftwheel-logs 'train_overrides=[\"max_steps=50\"]'",
                   'draftwheel flywheel --schedule "0 3 * * *" --config configs/flywheel.yaml'))
    _add_config_args(flywheel, "configs/flywheel.yaml", "trainer=dpo")
    add_log_dir(flywheel, "the serving logs to mine: the config's logs_dir (default: $DRAFTWHEEL_HOME/logs)")
    flywheel.add_argument("--schedule", metavar="CRON", help=SCHEDULE_HELP)
    flywheel.set_defaults(func=_flywheel)

    monitor = subparsers.add_parser(
        "monitor", help="check recent acceptance; run the flywheel if it fell",
        description="Read the champion's latest acceptance records; run the flywheel when the mean accepted "
                    "length as served or the draft's acceptance (overall or on a slice) fell below its "
                    "threshold, or the target's weights changed; report the champion's delivered gain. "
                    "--schedule serves it as a deployment instead.",
        **examples("draftwheel monitor run_flywheel=false  # report only",
                   "draftwheel monitor --log-dir /tmp/draftwheel-logs --set min_acceptance=0.4",
                   'draftwheel monitor --schedule "*/15 * * * *"'))
    _add_config_args(monitor, "configs/monitor.yaml", "min_acceptance=0.4")
    add_log_dir(monitor, "the serving logs to watch: the config's logs_dir (default: $DRAFTWHEEL_HOME/logs)")
    monitor.add_argument("--schedule", metavar="CRON", help=SCHEDULE_HELP)
    monitor.set_defaults(func=_monitor)

    demo = subparsers.add_parser(
        "demo", help="the whole loop end to end on embedded defaults, with a before/after table",
        description="The whole loop end to end on the embedded defaults: bootstrap (when there is no "
                    "champion), serve chat traffic, shift to code, the monitor runs the flywheel (mine, train, "
                    "shadow, promote), then a before/after table: plain decoding, the old and the new champion "
                    "on held-out chat and code prompts.",
        **examples("draftwheel demo",
                   "draftwheel demo code_requests=24",
                   "draftwheel demo --config configs/demo.yaml --k 4 --min-path-prob 0.25 --dtype float32"))
    _add_config_args(demo, "configs/demo.yaml", "code_requests=24")
    add_k(demo, None)
    add_min_path_prob(demo, None)
    add_dtype(demo, None)
    demo.set_defaults(func=_demo)


def check_config(args: argparse.Namespace, cls: type) -> bool:
    """Validate the config, and the stage configs of the flywheel it runs, before any Prefect server
    starts, so a typo fails in seconds, not after mining and training."""
    from draftwheel.config import load_config

    try:
        config = load_config(cls, args.config, list(args.overrides))
        config.check_stages()
    except ValueError as exc:  # ConfigError included
        print(f"draftwheel {args.command}: config error: {exc}", file=sys.stderr)
        return False
    return True


def has_prefect_server(what: str) -> bool:
    """Whether a Prefect server is configured (PREFECT_API_URL); if not, say on stderr what to start for `what`."""
    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():
        return True
    print(f"draftwheel {what}: no Prefect server configured. Start one and point at it:\n"
          f"  prefect server start            # in another terminal\n"
          f"  export PREFECT_API_URL=http://127.0.0.1:4200/api\n"
          f"(Prefect's temporary server lives only as long as one command: it keeps no schedules or deployments.)",
          file=sys.stderr)
    return False


def _serve(flow_obj: Any, args: argparse.Namespace) -> int:
    """Serve `flow_obj` as a deployment on `args.schedule` (blocks until interrupted)."""
    from prefect.types.entrypoint import EntrypointType

    if not has_prefect_server(f"{args.command} --schedule"):
        return USAGE
    flow_obj.serve(name=f"draftwheel-{args.command}", cron=args.schedule,
                   parameters={"config_path": args.config, "overrides": list(args.overrides)},
                   entrypoint_type=EntrypointType.MODULE_PATH)
    return 0


def _run_scheduled_flow(args: argparse.Namespace, flow_obj: Any, config_cls: type, failure: str,
                        summarise: Any) -> int:
    """Validate the config, then serve `flow_obj` on `--schedule` or run it once and print `summarise(result)`."""
    from draftwheel.locks import LockedError
    from draftwheel.flows.flywheel import StageError

    if not check_config(args, config_cls):
        return USAGE
    if args.schedule:
        return _serve(flow_obj, args)
    try:
        result = flow_obj(args.config, list(args.overrides))
    except StageError as exc:
        print(f"draftwheel {args.command}: {failure}: {exc}. The champion is unchanged.", file=sys.stderr)
        return FAILURE
    except LockedError as exc:
        print(f"draftwheel {args.command}: {exc}. Nothing ran.", file=sys.stderr)
        return FAILURE
    print(json.dumps(summarise(result), indent=2))
    return 0


def _flywheel(args: argparse.Namespace) -> int:
    from draftwheel.flows.flywheel import FlywheelConfig, flywheel

    args.overrides = flag_overrides(args, FLAG_FIELDS)
    return _run_scheduled_flow(
        args, flywheel, FlywheelConfig, "a stage failed",
        lambda result: {k: result[k] for k in ("champion_before", "challenger_version", "promoted", "report_path")})


def _monitor(args: argparse.Namespace) -> int:
    from draftwheel.flows.monitor import MonitorConfig, monitor

    args.overrides = flag_overrides(args, FLAG_FIELDS)
    return _run_scheduled_flow(args, monitor, MonitorConfig, "the triggered flywheel failed",
                               lambda result: result["decision"])


def _demo(args: argparse.Namespace) -> int:
    from draftwheel.flows.demo import DemoConfig, demo

    args.overrides = flag_overrides(args, FLAG_FIELDS)
    if not check_config(args, DemoConfig):
        return USAGE
    demo(args.config, list(args.overrides))
    return 0
