# a second live sample for the delivered figure: 40 more code requests (seed 4) served by the promoted v2
set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
cd /work/main; export PYTHONPATH=/work/main DRAFTWHEEL_HOME=/work/i13g/roundv
.venv/bin/draftwheel traffic --workload code --n 40 --seed 4
.venv/bin/draftwheel monitor run_flywheel=false
.venv/bin/draftwheel status
echo ALLDONE
