# usage: round2.sh -> a second unattended round on a copy of can8 (v2 champion, 40 live code requests served by v2), then 40 new live code requests (seed 4)
set -x
NAME=round2
export DRAFTWHEEL_HOME=/work/i13f/$NAME HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
rm -rf /work/i13f/$NAME; cp -a /work/i13f/can8 /work/i13f/$NAME
cd /work/main; export PYTHONPATH=/work/main
s=$(date +%s)
.venv/bin/draftwheel monitor
echo "MONITOR_WALL_S $(( $(date +%s) - s ))"
.venv/bin/draftwheel traffic --workload code --n 40 --seed 4
.venv/bin/draftwheel monitor run_flywheel=false
.venv/bin/draftwheel status
echo ALLDONE
