# usage: bash round.sh STATE EXTRA
# STATE: a new state dir, copied from the state after traffic (/work/i13g/base: 30 mixed + 80 code requests, seed 1);
# EXTRA: more code requests (seed 3) served by v1 first (20: the 100 requests; 0: the 80 of earlier rounds).
# Then one unattended monitor round with the defaults, 80 live code requests (seeds 2, 4) and status.
# Ran as: round.sh /work/i13g/round100 20 (caeb197, round100.log), round.sh /work/i13g/round100c 20 (b152391,
# round100c.log), round.sh /work/i13g/round80c 0 (the same defaults, round80c.log).
set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=120
cd /work/main; export PYTHONPATH=/work/main
git log --oneline -1
rm -rf "$1"; cp -a /work/i13g/base "$1"
export DRAFTWHEEL_HOME="$1"
[ "$2" -gt 0 ] && .venv/bin/draftwheel traffic --workload code --n "$2" --seed 3
s=$(date +%s)
.venv/bin/draftwheel monitor
echo "MONITOR_WALL_S $(( $(date +%s) - s ))"
.venv/bin/draftwheel traffic --workload code --n 40 --seed 2
.venv/bin/draftwheel traffic --workload code --n 40 --seed 4
.venv/bin/draftwheel monitor run_flywheel=false
.venv/bin/draftwheel status
echo ALLDONE
