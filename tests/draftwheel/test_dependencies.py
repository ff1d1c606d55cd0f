"""pyproject.toml declares what the code imports: every third-party package the product packages import is a
runtime dependency, every runtime dependency is imported there (or says why not), and packages only the tests
or the benchmarks import live in the `test` / `bench` extras, not in what `pip install draftwheel` pulls in."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT = ("draftwheel", "serving", "mining", "evaluation", "training", "flows")
# Declared but never imported: another library loads them at run time.
NOT_IMPORTED = {"gguf": "transformers' GGUF reader (the reference target ships as GGUF)"}


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement).group()).lower()


def _project() -> dict:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def _imported_modules(folders: list[Path]) -> set[str]:
    """Top-level names of absolute imports in every .py file under `folders`, lazy imports included."""
    names: set[str] = set()
    for folder in folders:
        for path in folder.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names.update(alias.name.split(".")[0] for alias in node.names)
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names.add(node.module.split(".")[0])
    return names


def _third_party(modules: set[str], first_party: set[str]) -> dict[str, set[str]]:
    """module -> the distributions that provide it, for modules neither stdlib nor this repo's."""
    providers = importlib.metadata.packages_distributions()
    outside = modules - set(sys.stdlib_module_names) - first_party - {"__future__"}
    return {module: {_name(d) for d in providers.get(module, [module])} for module in sorted(outside)}


def test_every_package_the_product_imports_is_a_runtime_dependency():
    declared = {_name(r) for r in _project()["dependencies"]}
    imports = _third_party(_imported_modules([REPO / p for p in PRODUCT]), set(PRODUCT))
    missing = {module: dists for module, dists in imports.items() if not dists & declared}
    assert not missing, f"imported by the product but not in [project] dependencies: {missing}"


def test_every_runtime_dependency_is_imported_by_the_product_or_says_why_not():
    imported = set().union(*_third_party(_imported_modules([REPO / p for p in PRODUCT]), set(PRODUCT)).values())
    unused = {_name(r) for r in _project()["dependencies"]} - imported - set(NOT_IMPORTED)
    assert not unused, f"declared but never imported by the product: {sorted(unused)}"


def test_test_and_bench_only_packages_are_extras_that_cover_their_imports():
    project = _project()
    runtime = {_name(r) for r in project["dependencies"]}
    extras = {name: {_name(r) for r in reqs} for name, reqs in project["optional-dependencies"].items()}
    assert {"scipy", "psutil"}.isdisjoint(runtime)
    first_party = set(PRODUCT) | {"tests", "benchmarks"} | {p.stem for p in (REPO / "benchmarks").glob("*.py")}
    for extra, folder in (("test", "tests"), ("bench", "benchmarks")):
        needed = _third_party(_imported_modules([REPO / folder]), first_party)
        missing = {m: d for m, d in needed.items() if not d & (runtime | extras[extra])}
        assert not missing, f"{folder}/ imports what neither the runtime nor the {extra!r} extra declares: {missing}"
    setup = (REPO / "scripts" / "setup.sh").read_text()
    assert "-e '.[test,bench]'" in setup  # the suite runs the benchmarks' tests too
