"""The house's floors: each room imports only the rooms below it, lazy imports inside functions included.

From the ground up: the base (`draftwheel/`: config, state dir, MLflow tracking, registry names), the engine
(`serving/engine/`), the server and model loading (`serving/`), mining, evaluation (shadow replay and the
gate, which read mining's datasets), training (which scores candidates with evaluation), and the flows with
the command line on top. The engine also stays free of MLflow: registry URIs are resolved one floor up.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# Folder -> (room, floor). The longest folder that holds a file names its room.
ROOMS = {
    "draftwheel": ("base", 0),
    "serving/engine": ("engine", 1),
    "serving": ("serving", 2),
    "mining": ("mining", 3),
    "evaluation": ("evaluation", 4),
    "training": ("training", 5),
    "flows": ("flows", 6),
}
# Module prefix -> room, for what a file imports.
MODULE_ROOMS = {
    "draftwheel.serving.engine": "engine",
    "draftwheel.serving": "serving",
    "draftwheel.mining": "mining",
    "draftwheel.evaluation": "evaluation",
    "draftwheel.training": "training",
    "draftwheel.flows": "flows",
    "draftwheel": "base",
}
FLOOR = {room: floor for room, floor in ROOMS.values()}
# The base modules that talk to MLflow: the engine never imports them.
MLFLOW_MODULES = ("draftwheel.tracking", "draftwheel.registry")


def _room_of_file(path: Path, repo: Path) -> str:
    rel = path.relative_to(repo).as_posix()
    folder = max((f for f in ROOMS if rel.startswith(f + "/")), key=len)
    return ROOMS[folder][0]


def _room_of_module(module: str) -> str | None:
    for prefix in sorted(MODULE_ROOMS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return MODULE_ROOMS[prefix]
    return None


def _imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every absolute import in the file, wherever it stands; `from draftwheel.x import y`
    yields `draftwheel.x.y` too, since y may be a module."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _product_files() -> list[Path]:
    return sorted(p for folder in ROOMS for p in (REPO / folder).rglob("*.py"))


def upward_imports(files: list[Path], repo: Path = REPO) -> list[str]:
    """Every import from a room to a higher one, and every engine import of an MLflow module."""
    wrong = []
    for path in files:
        room = _room_of_file(path, repo)
        for line, module in _imports(path):
            target = _room_of_module(module)
            where = f"{path.relative_to(repo)}:{line} ({room}) imports {module}"
            if target is not None and FLOOR[target] > FLOOR[room]:
                wrong.append(f"{where} ({target}, a floor up)")
            elif room == "engine" and any(module == m or module.startswith(m + ".") for m in MLFLOW_MODULES):
                wrong.append(f"{where} (the engine stays free of MLflow)")
    return wrong


def test_every_room_imports_only_the_rooms_below_it():
    assert not upward_imports(_product_files())


@pytest.mark.parametrize("importer, module", [
    ("serving/engine/engine.py", "draftwheel.serving.server.metrics"),
    ("serving/engine/models.py", "draftwheel.tracking"),
    ("draftwheel/config.py", "draftwheel.flows.commands"),
    ("mining/pipeline.py", "draftwheel.evaluation.gate"),
])
def test_an_import_a_floor_up_is_caught(tmp_path, importer, module):
    """The check itself: a file that imports upward (even lazily, inside a function) is named, and the
    same file importing downward is not."""
    path = tmp_path / importer
    path.parent.mkdir(parents=True)
    path.write_text("from draftwheel.hashing import file_sha256\n")
    assert upward_imports([path], tmp_path) == []
    path.write_text(f"def f():\n    import {module}\n")
    wrong = upward_imports([path], tmp_path)
    assert len(wrong) == 1 and importer in wrong[0] and module in wrong[0]


def test_every_product_file_has_a_room():
    rooms = {_room_of_file(p, REPO) for p in _product_files()}
    assert rooms == set(FLOOR)
