"""One Prefect test server for the whole session (it takes 10-60 s to start), under a temp PREFECT_HOME.

The environment is set at import, before any test module imports Prefect, so Prefect's home, result
storage and analytics settings never touch the user's ~/.prefect.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

_PREFECT_HOME = tempfile.mkdtemp(prefix="draftwheel-test-prefect-")
atexit.register(shutil.rmtree, _PREFECT_HOME, ignore_errors=True)
os.environ["PREFECT_HOME"] = _PREFECT_HOME
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["MLFLOW_DISABLE_TELEMETRY"] = "true"
os.environ.pop("MLFLOW_TRACKING_URI", None)  # the tests' MLflow is the sqlite file in DRAFTWHEEL_HOME


@pytest.fixture(scope="session")
def prefect_server():
    from prefect.testing.utilities import prefect_test_harness

    # The default 30 s start-up limit is too tight on a busy 2-core machine.
    with prefect_test_harness(server_startup_timeout=180):
        yield


def artifacts_of(flow_run_id) -> dict[str, list]:
    """The Prefect artifacts a flow run made (not its subflows'), by key, newest first, read back through
    the API: markdown as text, tables parsed into their rows."""
    import json

    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])),
                                      sort=ArtifactSort.CREATED_DESC)
    by_key: dict[str, list] = {}
    for artifact in found:
        by_key.setdefault(artifact.key, []).append(json.loads(artifact.data) if artifact.type == "table"
                                                   else artifact.data)
    return by_key
