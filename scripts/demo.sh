#!/usr/bin/env bash
# The main job in one command after cloning: set up .venv (idempotent), then run the whole loop on the
# embedded defaults (CPU, Prefect's temporary server, MLflow sqlite under ./.draftwheel).
# Extra arguments go to `draftwheel demo`, e.g. `bash scripts/demo.sh code_requests=24`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/draftwheel demo "$@"
