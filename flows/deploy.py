"""`draftwheel deploy`: the monitor and flywheel flows as Prefect deployments on a work pool.

A deployment is registered with the Prefect server that PREFECT_API_URL names (without one the command
refuses, saying what to start); the work pool (a `process` pool by default) is created when it is missing.
A worker (`prefect worker start --pool NAME`) then runs each flow run in a subprocess of its own Python.

How the worker finds the code: the deployment's entrypoint is the flow's module path
(`draftwheel.flows.monitor.monitor`), imported from the environment the worker runs in, with no pull
step. That works offline on any machine where draftwheel is installed (`pip install -e .` of this
checkout, or a built image), where the alternatives do not: `flow.from_source(<repo dir>)` points the
worker at a file path (`flows/monitor.py`), which Prefect loads as a loose script, a second copy of the
module beside the installed `draftwheel.flows.monitor`; and a shipped `prefect.yaml` would have to
spell out the deployer's state dir and config by hand. What the command line decides is passed on instead:
the flow's parameters (`--config`, made absolute, and the overrides) and, as job variables, the
directory the command ran in (a `process` pool's `working_dir`, so relative paths resolve as they did
here) and the environment the flows read (`DRAFTWHEEL_HOME` made absolute, `MLFLOW_TRACKING_URI`, the
offline defaults). The flows themselves are unchanged; this module only registers them.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path
from typing import Any

from draftwheel.cli_help import examples
from draftwheel.config import add_override_arguments
from draftwheel.exit_codes import FAILURE, USAGE

# flow -> (module, flow object, config class): what `--flow` names.
DEPLOYABLE = {"monitor": ("draftwheel.flows.monitor", "monitor", "MonitorConfig"),
              "flywheel": ("draftwheel.flows.flywheel", "flywheel", "FlywheelConfig")}
ALL = "all"
DEFAULT_POOL = "draftwheel"
POOL_TYPE = "process"
# Besides DRAFTWHEEL_HOME, the variables a flow run takes from the deploying environment when they are set
# there (the non-Prefect offline defaults among them: a worker is started without `draftwheel`'s).
PASSED_ENV = ("MLFLOW_TRACKING_URI", "MLFLOW_DISABLE_TELEMETRY", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR",
              "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "DO_NOT_TRACK")


def deployment_name(flow: str) -> str:
    """The deployment's name (the same one `draftwheel FLOW --schedule` serves)."""
    return f"draftwheel-{flow}"


def register(subparsers: Any) -> None:
    deploy = subparsers.add_parser(
        "deploy", help="register the monitor and flywheel as Prefect deployments on a work pool",
        description="Register the monitor and flywheel flows as deployments on a Prefect work pool (a process "
                    "pool, created when missing) of the server PREFECT_API_URL names, with their config and "
                    "overrides as parameters, this directory as the working dir and this state dir. A worker "
                    "(`prefect worker start --pool NAME`, where draftwheel is installed) runs them; --cron "
                    "schedules one. --config, overrides and --cron apply to one flow: name it with --flow.",
        **examples('draftwheel deploy --flow monitor --cron "*/15 * * * *" --set min_acceptance=0.4',
                   "draftwheel deploy  # both flows on the pool 'draftwheel', run on demand",
                   'draftwheel deploy --flow flywheel --cron "0 3 * * *" --config configs/flywheel.yaml --pool gpu'))
    deploy.add_argument("--pool", default=DEFAULT_POOL, metavar="NAME",
                        help=f"the work pool (default: {DEFAULT_POOL}; created as a {POOL_TYPE} pool when missing)")
    deploy.add_argument("--flow", choices=[*DEPLOYABLE, ALL], default=ALL,
                        help="which flow to deploy (default: all; the monitor starts the flywheel itself when it triggers)")
    deploy.add_argument("--cron", metavar="EXPR", help="run the deployment on this cron schedule (default: on demand)")
    deploy.add_argument("--config", default=None, metavar="FILE",
                        help="the flow's YAML config (e.g. configs/monitor.yaml); default: the built-in defaults")
    add_override_arguments(deploy, "min_acceptance=0.4")
    deploy.set_defaults(func=_deploy)


def flows_of(args: argparse.Namespace) -> list[str]:
    return list(DEPLOYABLE) if args.flow == ALL else [args.flow]


def config_class(flow: str) -> type:
    module, _, cls = DEPLOYABLE[flow]
    return getattr(importlib.import_module(module), cls)


def per_flow_error(args: argparse.Namespace) -> str:
    """Why the arguments cannot go to `--flow all` ("" when they can)."""
    given = [name for name, value in (("--cron", args.cron), ("--config", args.config),
                                       ("overrides", args.overrides)) if value]
    if args.flow != ALL or not given:
        return ""
    verb = "applies" if given == ["--cron"] or given == ["--config"] else "apply"
    return (f"{' and '.join(given)} {verb} to one flow: name it with --flow monitor or --flow flywheel (the "
            f"monitor starts the flywheel itself when it triggers)")


def cron_error(expr: str | None) -> str:
    """Why `expr` is not a cron schedule Prefect accepts ("" when it is)."""
    if expr is None:
        return ""
    from prefect.client.schemas.schedules import CronSchedule

    try:
        CronSchedule(cron=expr)
    except ValueError:  # pydantic's ValidationError
        return f"--cron {expr!r}: not a cron expression (five fields, e.g. \"0 3 * * *\")"
    return ""


def job_variables(pool_type: str) -> dict[str, Any]:
    """What a flow run takes from here: the environment the flows read and, on a process pool, this directory."""
    from draftwheel import home

    env = {"DRAFTWHEEL_HOME": str(home.state_dir())}
    env.update({name: os.environ[name] for name in PASSED_ENV if os.environ.get(name)})
    return {"env": env, **({"working_dir": str(Path.cwd())} if pool_type == POOL_TYPE else {})}


def ensure_pool(name: str) -> tuple[Any, bool]:
    """The work pool `name`, created as a process pool when missing; (pool, created)."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            return client.read_work_pool(name), False
        except ObjectNotFound:
            pass
        template = ProcessWorker.get_default_base_job_template()
        try:
            return client.create_work_pool(WorkPoolCreate(name=name, type=POOL_TYPE, base_job_template=template)), True
        except ObjectAlreadyExists:  # created meanwhile by someone else
            return client.read_work_pool(name), False


def deploy_flow(flow: str, pool: Any, cron: str | None, config_path: str | None, overrides: list[str]) -> str:
    """Register (or update) `flow`'s deployment on `pool`; return its full name, `FLOW/DEPLOYMENT`."""
    from prefect.types.entrypoint import EntrypointType

    module, attr, _ = DEPLOYABLE[flow]
    flow_obj = getattr(importlib.import_module(module), attr)
    deployment = flow_obj.to_deployment(
        name=deployment_name(flow), cron=cron, parameters={"config_path": config_path, "overrides": overrides},
        work_pool_name=pool.name, job_variables=job_variables(pool.type), tags=["draftwheel"],
        entrypoint_type=EntrypointType.MODULE_PATH)
    deployment.apply(work_pool_name=pool.name)
    return f"{flow_obj.name}/{deployment.name}"


def _deploy(args: argparse.Namespace) -> int:
    from draftwheel import home
    from draftwheel.flows.cli import check_config, has_prefect_server

    problem = per_flow_error(args) or cron_error(args.cron)
    if problem:
        print(f"draftwheel deploy: {problem}", file=sys.stderr)
        return USAGE
    if not all(check_config(args, config_class(flow)) for flow in flows_of(args)):
        return USAGE
    if not has_prefect_server("deploy"):
        return USAGE
    from prefect.settings import PREFECT_API_URL

    config_path = str(Path(args.config).resolve()) if args.config else None
    try:
        pool, created = ensure_pool(args.pool)
        names = [deploy_flow(flow, pool, args.cron, config_path, list(args.overrides)) for flow in flows_of(args)]
    except Exception as exc:  # an unreachable server, a refused deployment: one line, nothing half-said
        print(f"draftwheel deploy: the Prefect server at {PREFECT_API_URL.value()} refused or did not answer: "
              f"{type(exc).__name__}: {exc}".replace("\n", " "), file=sys.stderr)
        return FAILURE
    print(f"work pool {pool.name!r} ({pool.type}{', created' if created else ''})")
    for name in names:
        print(f"deployed {name}: {'cron ' + args.cron if args.cron else 'no schedule, runs on demand'}")
    print(f"flow runs start in {Path.cwd()} with DRAFTWHEEL_HOME={home.state_dir()}\n"
          f"start a worker where draftwheel is installed (it runs the flows with its own Python):\n"
          f"  prefect worker start --pool {pool.name}\n"
          f"run one now:\n" + "\n".join(f"  prefect deployment run '{name}'" for name in names))
    return 0
