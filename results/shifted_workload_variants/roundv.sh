# one unattended monitor round with prompt variants, from the state after traffic; then 40 live code requests (seed 2)
set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
cd /work/main; export PYTHONPATH=/work/main
rm -rf /work/i13g/roundv; cp -a /work/i13g/base /work/i13g/roundv
export DRAFTWHEEL_HOME=/work/i13g/roundv
s=$(date +%s)
.venv/bin/draftwheel monitor
echo "MONITOR_WALL_S $(( $(date +%s) - s ))"
.venv/bin/draftwheel traffic --workload code --n 40 --seed 2
.venv/bin/draftwheel monitor run_flywheel=false
.venv/bin/draftwheel status
echo ALLDONE
