#!/usr/bin/env bash
# Run the test suite (fast tests; add `-m slow` for the end-to-end runs on the reference model).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export DRAFTWHEEL_HOME="${DRAFTWHEEL_HOME:-$(mktemp -d)/draftwheel}"
exec .venv/bin/python -m pytest -q "$@"
