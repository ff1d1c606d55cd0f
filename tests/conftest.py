"""Fixtures shared by the whole suite.

- `one_torch_thread` (session, autouse): tiny models run fastest on one thread, and multi-threaded
  kernels slow down badly when other jobs share a 2-core machine (measured: 284 s vs 18 s for the
  serving tests).
- `module_home`: a fresh state dir (`DRAFTWHEEL_HOME`) for one test module, so each module gets its own
  sqlite MLflow registry; MLflow initialises a store in seconds, so modules share one rather than tests.
- `read_only_dir`: a directory nobody can create entries in, for the unwritable-output tests.
- `alias_bomb`: writes a config file whose one real field is a YAML alias bomb, for the commands' tests.
"""

from __future__ import annotations

import os
import subprocess

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


@pytest.fixture
def alias_bomb(tmp_path):
    """`write(field)` -> a YAML file of a few hundred bytes whose `field` expands to 9**9 (~387M) strings:
    nine levels, each a list of nine aliases of the level below. A loader that builds it runs out of
    memory; a command must refuse it from the token stream."""
    def write(field: str, name: str = "bomb.yaml"):
        levels = [f"&l0 [{', '.join(['x'] * 9)}]"]
        levels += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, 9)]
        path = tmp_path / name
        path.write_text(f"{field}: [{', '.join(levels)}]\n")
        return path
    return write


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nobody can create entries in, root included (chattr +i), or skip; unlocked afterwards."""
    path = tmp_path / "locked"
    path.mkdir()
    os.chmod(path, 0o555)
    if os.geteuid() == 0 and subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root without chattr: no directory is read-only")
    yield path
    subprocess.run(["chattr", "-i", str(path)], capture_output=True)
    os.chmod(path, 0o755)
