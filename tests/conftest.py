"""Fixtures shared by the whole suite.

- `one_torch_thread` (session, autouse): tiny models run fastest on one thread, and multi-threaded
  kernels slow down badly when other jobs share a 2-core machine (measured: 284 s vs 18 s for the
  serving tests).
- `module_home`: a fresh state dir (`DRAFTWHEEL_HOME`) for one test module, so each module gets its own
  sqlite MLflow registry; MLflow initialises a store in seconds, so modules share one rather than tests.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def module_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("home")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTWHEEL_HOME", str(home))
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
        yield home
