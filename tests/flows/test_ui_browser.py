"""The MLflow UI and the Prefect UI, looked at in a real headless browser after a flywheel round.

A round on the tiny flow world (tests/flows/toy_world.py: a random `bad` champion, the candidate a copy of
`good`, the target's own function) runs against a `prefect server start` of the test's own, on a free
port, and promotes; then `mlflow server` serves the state dir's sqlite store, and Chromium (Debian's
`chromium` (`apt-get install -y chromium`), driven by playwright from the `test` extra) opens the pages a user
would. Every check waits for text the single-page apps render, so it fails if the page never shows it:

- MLflow, the registered model's page: one `@ champion` alias on the page, in the new version's row, with
  that version's tags (`target_sha256` and the target's weights sha256, `shadow_decision`);
- MLflow, the version's page: aliases `@ champion` and `@ challenger`, the tags table with `draft_kind` and
  `target_sha256` and their values; the former champion's page shows `@ previous`, not `@ champion`;
- Prefect, the runs page: the flow run's name, in a list item with its state `Completed` and its flow
  `flywheel`;
- Prefect, the flow run's Artifacts tab: `draftwheel-gate`, `draftwheel-gate-slices`, `draftwheel-shadow`;
  the gate artifact (its card's link) opened: the heading `Gate: PROMOTE` and the gate's `ok: lossless`
  check line, as rendered from the markdown.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from draftwheel import home
from draftwheel.flows.artifacts import GATE_KEY, GATE_SLICES_KEY, SHADOW_KEY
from draftwheel.flows.flywheel import flywheel, override
from draftwheel.registry_names import CHAMPION_URI, DRAFT_MODEL, TARGET_SHA_TAG
from draftwheel.serving.engine.models import weights_sha256
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.sink import JsonlSink
from draftwheel.serving.loading import engine_from_specs
from tests.conftest import make_champion
from tests.flows.toy_world import build_models, register_drafts, word_salads

pytestmark = pytest.mark.slow

START_TIMEOUT_S = 240  # a Prefect server starts in 10-60 s alone, several times that on a loaded 2-core machine
PAGE_TIMEOUT_MS = 60_000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def server(command: list[str], health_url: str, env: dict[str, str], log: Path):
    """`command` in its own process group until the block ends; up once `health_url` answers 200."""
    with open(log, "w") as out:
        process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                with urllib.request.urlopen(health_url, timeout=5) as answer:
                    if answer.status == 200:
                        break
            except OSError:
                pass
            if process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{command[2:5]} did not come up at {health_url}:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        yield
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


@pytest.fixture
def chromium():
    """A headless Chromium under playwright (the system's chromium: playwright's own download is not used)."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is in the `test` extra")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip("no chromium on PATH: apt-get install -y chromium")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=executable, headless=True)
        page = browser.new_page(viewport={"width": 1600, "height": 1200})
        page.set_default_timeout(PAGE_TIMEOUT_MS)
        yield page, sync_api.expect
        browser.close()


@pytest.fixture
def prefect_ui(tmp_path):
    """`prefect server start` of this test's own (its own Prefect home and database) on a free port: the API
    and the UI it serves. The UI asks the server for the API's address, which follows the API port setting."""
    port = free_port()
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-server"), "PREFECT_SERVER_API_HOST": "127.0.0.1",
           "PREFECT_SERVER_API_PORT": str(port), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)]
    url = f"http://127.0.0.1:{port}"
    with server(command, f"{url}/api/health", env, tmp_path / "prefect-server.log"):
        yield url


@pytest.fixture
def promoted_round(tmp_path, monkeypatch, prefect_ui, one_torch_thread):
    """A flywheel round that promotes, its flow run recorded by `prefect_ui`'s server."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey, FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "home"))
    dirs = build_models(tmp_path / "models")
    versions = register_drafts(dirs, ("bad",))
    make_champion(versions["bad"])
    with JsonlSink(tmp_path / "logs") as sink:
        engine = engine_from_specs(dirs["target"], CHAMPION_URI, sink=sink)
        for row in word_salads(16):
            engine.generate([row["prompt"]], SamplingParams(max_new_tokens=12, k=4), slice=row["slice"], chat=True)
    with temporary_settings({PREFECT_API_URL: f"{prefect_ui}/api"}):
        state = flywheel(None, ["trainer=tests.flows.toy_trainers:copy_model", f"target={dirs['target']}",
                                f"logs_dir={tmp_path / 'logs'}", override("train_overrides", [f"source={dirs['good']}"]),
                                override("mining_overrides", ["holdout_fraction=0.5"]),
                                override("shadow_overrides", ["max_new_tokens=12", "min_requests=4",
                                                              "include_canary=false"])],
                         return_state=True)
        result = state.result()
        with get_client(sync_client=True) as client:
            flow_run = client.read_flow_run(state.state_details.flow_run_id)
            gate, = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[GATE_KEY])),
                                          flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
    assert result["promoted"], result["decision"]
    return {"result": result, "flow_run": flow_run, "gate_artifact": gate.id, "former": versions["bad"],
            "target_sha": weights_sha256(dirs["target"])}


@pytest.fixture
def mlflow_ui(tmp_path, promoted_round):
    """`mlflow server` on the state dir's sqlite store (the README's `mlflow ui` line), on a free port."""
    port = free_port()
    store = f"sqlite:///{home.state_dir() / 'mlflow.db'}"
    command = [sys.executable, "-m", "mlflow", "server", "--backend-store-uri", store, "--host", "127.0.0.1",
               "--port", str(port), "--workers", "1"]
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    url = f"http://127.0.0.1:{port}"
    with server(command, f"{url}/health", env, tmp_path / "mlflow-server.log"):
        yield url


def test_the_champion_its_tags_the_flow_run_and_the_gate_show_in_the_uis(promoted_round, mlflow_ui, prefect_ui,
                                                                          chromium):
    page, expect = chromium
    version, former = promoted_round["result"]["challenger_version"], promoted_round["former"]
    target_sha = promoted_round["target_sha"]

    # MLflow: the registered model's page lists the new version, its row with its alias and tags.
    page.goto(f"{mlflow_ui}/#/models/{DRAFT_MODEL}")
    expect(page.get_by_text(f"Version {version}", exact=True)).to_be_visible()
    expect(page.get_by_text(re.compile(r"^@\s*champion$"))).to_have_count(1)
    row = page.get_by_role("row").filter(has_text=f"Version {version}")
    for shown in (re.compile(r"@\s*champion"), TARGET_SHA_TAG, target_sha, "shadow_decision"):
        expect(row).to_contain_text(shown)

    # MLflow: the version's own page, its aliases and its tags table.
    page.goto(f"{mlflow_ui}/#/models/{DRAFT_MODEL}/versions/{version}")
    expect(page.get_by_text(re.compile(r"^@\s*champion$"))).to_be_visible()
    expect(page.get_by_text(re.compile(r"^@\s*challenger$"))).to_be_visible()
    for key, value in ((TARGET_SHA_TAG, target_sha), ("draft_kind", "lm")):
        row = page.get_by_role("row").filter(has_text=key)
        expect(row.first).to_contain_text(value)
    page.goto(f"{mlflow_ui}/#/models/{DRAFT_MODEL}/versions/{former}")
    expect(page.get_by_text(re.compile(r"^@\s*previous$"))).to_be_visible()
    expect(page.get_by_text(re.compile(r"^@\s*champion$"))).to_have_count(0)

    # Prefect: the runs page shows the flow run, its flow and its state.
    flow_run = promoted_round["flow_run"]
    page.goto(f"{prefect_ui}/runs")
    name = page.get_by_text(flow_run.name, exact=True)
    expect(name).to_be_visible()
    listed = name.locator("xpath=ancestor::*[contains(normalize-space(.), 'Completed')][1]")  # the run's list item
    expect(listed).to_contain_text("flywheel")

    # Prefect: the flow run's artifacts, and the gate's decision rendered.
    page.goto(f"{prefect_ui}/runs/flow-run/{flow_run.id}")
    expect(page.get_by_text(flow_run.name, exact=True).first).to_be_visible()
    page.get_by_text("Artifacts", exact=True).first.click()
    for key in (GATE_KEY, GATE_SLICES_KEY, SHADOW_KEY):
        expect(page.get_by_text(key, exact=True)).to_be_visible()
    page.locator(f"a[href='/artifacts/artifact/{promoted_round['gate_artifact']}']").click()
    expect(page.get_by_role("heading", name="Gate: PROMOTE")).to_be_visible()
    expect(page.get_by_text(re.compile(r"ok: lossless")).first).to_be_visible()
