# the 80-request round again at the new defaults (max_mined_per_epoch 1600: 3.9 passes), from the state after traffic; then 80 live code requests (seeds 2, 4)
set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
cd /work/main; export PYTHONPATH=/work/main
git log --oneline -1
rm -rf /work/i13g/round80c; cp -a /work/i13g/base /work/i13g/round80c
export DRAFTWHEEL_HOME=/work/i13g/round80c
s=$(date +%s)
.venv/bin/draftwheel monitor
echo "MONITOR_WALL_S $(( $(date +%s) - s ))"
.venv/bin/draftwheel traffic --workload code --n 40 --seed 2
.venv/bin/draftwheel traffic --workload code --n 40 --seed 4
.venv/bin/draftwheel monitor run_flywheel=false
.venv/bin/draftwheel status
echo ALLDONE
