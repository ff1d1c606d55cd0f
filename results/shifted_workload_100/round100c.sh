# the upper bound of new-slice traffic: base's 80 code requests (seed 1) + 20 more (seed 3), then one
# unattended monitor round with the defaults; then 80 live code requests (seeds 2, 4) and status
set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
cd /work/main; export PYTHONPATH=/work/main
git log --oneline -1
rm -rf /work/i13g/round100c; cp -a /work/i13g/base /work/i13g/round100c
export DRAFTWHEEL_HOME=/work/i13g/round100c
.venv/bin/draftwheel traffic --workload code --n 20 --seed 3
s=$(date +%s)
.venv/bin/draftwheel monitor
echo "MONITOR_WALL_S $(( $(date +%s) - s ))"
.venv/bin/draftwheel traffic --workload code --n 40 --seed 2
.venv/bin/draftwheel traffic --workload code --n 40 --seed 4
.venv/bin/draftwheel monitor run_flywheel=false
.venv/bin/draftwheel status
echo ALLDONE
