"""`draftwheel deploy` against a real Prefect server: a process work pool, a worker in its own process, a
triggered deployment run that completes.

The server is the session's (`prefect_server`: Prefect's test harness runs `prefect server` in a
subprocess on a free port). The worker is `prefect worker start --run-once` in a subprocess that knows
the server's URL and nothing of the test's state dir or working directory: the run finds the registry
and the logs only through what `deploy` put in the deployment (DRAFTWHEEL_HOME, the working dir, the
overrides). The monitor is the cheapest flow to run: it reads the logs and decides.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from draftwheel.flows.artifacts import MONITOR_KEY
from draftwheel.flows.commands import main
from draftwheel.flows.deploy import deployment_name
from draftwheel.registry_names import CHAMPION_URI
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.sink import JsonlSink
from draftwheel.serving.loading import engine_from_specs
from tests.conftest import make_champion
from tests.flows.conftest import artifacts_of
from tests.flows.toy_world import build_models, register_drafts, word_salads

WORKER_TIMEOUT_S = 300


@pytest.fixture
def api_url(prefect_server):
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value()


@pytest.fixture
def served_world(tmp_path, monkeypatch, one_torch_thread):
    """A state dir whose champion (`bad`, accepted only by chance) served 8 requests into ./logs."""
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    dirs = build_models(tmp_path / "models")
    version = register_drafts(dirs, ("bad",))["bad"]
    make_champion(version)
    with JsonlSink(tmp_path / "logs") as sink:
        engine = engine_from_specs(dirs["target"], CHAMPION_URI, sink=sink)
        for row in word_salads(8):
            engine.generate([row["prompt"]], SamplingParams(max_new_tokens=12, k=4), slice=row["slice"], chat=True)
    return {"dirs": dirs, "version": version}


def run_worker(pool: str, api_url: str, cwd) -> str:
    """`prefect worker start --pool POOL --run-once` in its own process: it takes the runs due now, runs each
    in a subprocess and returns once they finished. Killed if it outlives WORKER_TIMEOUT_S."""
    env = {k: v for k, v in os.environ.items() if k != "DRAFTWHEEL_HOME"}
    env["PREFECT_API_URL"] = api_url
    worker = subprocess.Popen([sys.executable, "-m", "prefect", "worker", "start", "--pool", pool, "--run-once"],
                              env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        return worker.communicate(timeout=WORKER_TIMEOUT_S)[0]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()


def test_a_deployed_monitor_runs_on_a_process_worker_to_completion(served_world, api_url, tmp_path, capsys):
    from prefect import get_client
    from prefect.deployments import run_deployment

    pool = f"draftwheel-test-{uuid.uuid4().hex[:8]}"
    overrides = ["logs_dir=logs", f"target={served_world['dirs']['target']}", "run_flywheel=false",
                 "window_requests=8", "min_requests=4", "min_acceptance=0.5"]
    assert main(["deploy", "--pool", pool, "--flow", "monitor", *overrides]) == 0
    printed = capsys.readouterr().out
    name = f"monitor/{deployment_name('monitor')}"
    assert f"prefect worker start --pool {pool}" in printed and f"prefect deployment run '{name}'" in printed
    with get_client(sync_client=True) as client:
        created = client.read_work_pool(pool)
        deployment = client.read_deployment_by_name(name)
    assert created.type == "process"  # created by deploy, with the process worker's job template
    assert "working_dir" in created.base_job_template["variables"]["properties"]
    assert deployment.work_pool_name == pool and deployment.entrypoint == "draftwheel.flows.monitor.monitor"
    assert deployment.parameters == {"config_path": None, "overrides": overrides}
    assert deployment.job_variables["working_dir"] == str(tmp_path)
    assert deployment.job_variables["env"]["DRAFTWHEEL_HOME"] == str(tmp_path / "home")

    flow_run = run_deployment(name, timeout=0, as_subflow=False)  # scheduled now; no worker yet
    elsewhere = tmp_path / "worker"
    elsewhere.mkdir()
    output = run_worker(pool, api_url, elsewhere)
    with get_client(sync_client=True) as client:
        state = client.read_flow_run(flow_run.id).state
    assert state is not None and state.is_completed(), f"{state}\n{output[-4000:]}"
    # The run read the logs under the deploying directory and the champion from the deploying state dir:
    # the bad champion's acceptance is below 0.5 on 8 requests, so the monitor triggered (and, as told,
    # ran no flywheel).
    verdict, = artifacts_of(flow_run.id)[MONITOR_KEY]
    assert verdict.startswith("# Monitor: TRIGGER") and f"champion v{served_world['version']}" in verdict
    assert "acceptance" in verdict and "| overall |" in verdict

    # Redeploying replaces the schedule: a cron when given, none without.
    for cron, expected in (("0 3 * * *", ["0 3 * * *"]), (None, [])):
        assert main(["deploy", "--pool", pool, "--flow", "monitor", *(["--cron", cron] if cron else [])]) == 0
        with get_client(sync_client=True) as client:
            schedules = client.read_deployment_by_name(name).schedules
        assert [s.schedule.cron for s in schedules] == expected


def test_deploy_refuses_what_only_one_flow_can_take(capsys):
    assert main(["deploy", "--cron", "0 3 * * *"]) == 2
    err = capsys.readouterr().err
    assert "--cron applies to one flow" in err and "--flow monitor" in err and len(err.strip().splitlines()) == 1
    assert main(["deploy", "min_acceptance=0.4"]) == 2
    assert "overrides apply to one flow" in capsys.readouterr().err
    assert main(["deploy", "--flow", "monitor", "--cron", "every night"]) == 2
    assert "not a cron expression" in capsys.readouterr().err
    assert main(["deploy", "--flow", "monitor", "min_acceptance=7"]) == 2
    assert "min_acceptance" in capsys.readouterr().err


def test_deploy_without_a_prefect_server_explains_what_to_start(tmp_path):
    # A subprocess: the session's Prefect test server would otherwise count as a configured API.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env["DRAFTWHEEL_HOME"] = str(tmp_path / "home")
    result = subprocess.run([sys.executable, "-m", "draftwheel.flows.commands", "deploy"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2
    assert "draftwheel deploy: no Prefect server configured" in result.stderr
    assert "prefect server start" in result.stderr and "PREFECT_API_URL" in result.stderr
