# usage: data2x.sh -> a copy of home-after-traffic plus 80 more code requests (seed 3), one monitor at main, live probe on seed 2
set -x
NAME=data2x
export DRAFTWHEEL_HOME=/work/i13f/$NAME HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
rm -rf /work/i13f/$NAME; cp -a /work/i13f/home-after-traffic /work/i13f/$NAME
cd /work/main; export PYTHONPATH=/work/main
.venv/bin/draftwheel traffic --workload code --n 80 --seed 3
s=$(date +%s)
.venv/bin/draftwheel monitor
echo "MONITOR_WALL_S $(( $(date +%s) - s ))"
.venv/bin/python /work/x21/live_eval.py /work/i13f/$NAME/models/registry/draftwheel-draft/2 2>&1 | grep LIVE
echo ALLDONE
