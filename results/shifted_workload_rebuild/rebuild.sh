# rebuild the issue-13 state from scratch at HEAD: bootstrap, traffic, save base, one monitor run, live seed 2
set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
cd /work/main; export PYTHONPATH=/work/main
export DRAFTWHEEL_HOME=/work/i13g/base
s=$(date +%s)
.venv/bin/draftwheel bootstrap
echo "BOOTSTRAP_WALL_S $(( $(date +%s) - s ))"
cp -a /work/i13g/base /work/i13g/bootstrapped
.venv/bin/draftwheel traffic --workload mixed --n 30
.venv/bin/draftwheel traffic --workload code --n 80 --seed 1
echo "TRAFFIC_DONE $(( $(date +%s) - s ))"
rm -rf /work/i13g/round; cp -a /work/i13g/base /work/i13g/round
export DRAFTWHEEL_HOME=/work/i13g/round
s=$(date +%s)
.venv/bin/draftwheel monitor
echo "MONITOR_WALL_S $(( $(date +%s) - s ))"
.venv/bin/draftwheel traffic --workload code --n 40 --seed 2
.venv/bin/draftwheel monitor run_flywheel=false
.venv/bin/draftwheel status
echo ALLDONE
