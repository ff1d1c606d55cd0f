"""One installed namespace: the stage folders at the top of the checkout install as `draftwheel.serving`,
`draftwheel.mining`, ... and a built wheel holds nothing else at its top level."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _setuptools() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def _package_folders() -> dict[str, Path]:
    """Installed package name -> its folder in the checkout, per pyproject's package-dir mapping."""
    mapping = _setuptools()["package-dir"]
    folders = {}
    for top, folder in {**mapping, "draftwheel": "draftwheel"}.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            folders[".".join((top, *rel))] = init.parent
    return folders


def test_every_package_folder_is_listed_for_installation():
    """The Python packages, and the shipped configs as package data."""
    assert sorted(_setuptools()["packages"]) == sorted([*_package_folders(), "draftwheel.configs"])


def _source_copy(dest: Path) -> Path:
    """What the wheel is built from, copied: setuptools writes its build/ folder into the source tree."""
    dest.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, dest / name)
    for folder in {*_setuptools()["package-dir"].values(), "draftwheel"}:
        shutil.copytree(REPO / folder, dest / folder, ignore=shutil.ignore_patterns("__pycache__"))
    return dest


def test_a_built_wheel_installs_only_draftwheel_names(tmp_path):
    source = _source_copy(tmp_path / "source")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path), str(source)], check=True, capture_output=True, timeout=300,
                   cwd=tmp_path)
    wheel, = tmp_path.glob("draftwheel-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {"draftwheel", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}
    for package in ("serving/engine/engine.py", "serving/server/app.py", "evaluation/gate.py",
                    "mining/pipeline.py", "training/eagle_train.py", "flows/commands.py",
                    "configs/serve.yaml", "configs/canary.jsonl"):
        assert f"draftwheel/{package}" in names
