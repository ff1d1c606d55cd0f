# usage: NAME=.. DATA=<dataset dir> CONT=192 PASSES=3 PV=2 REH=196 bash arm.sh   (offline arm from v1 on the round's data; 80-request eval)
set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false
export DRAFTWHEEL_HOME=/work/i13g/exp
cd /work/main; export PYTHONPATH=${PP:-/work/main}
RD=$(ls -d /work/i13g/exp/flywheel/2*/datasets)
N=$(.venv/bin/python -c "from datasets import load_from_disk; print(len(load_from_disk('$DATA')))")
R=$(.venv/bin/python -c "print(round(${REH:-196}/$N, 3))")
s=$(date +%s)
.venv/bin/draftwheel train eagle dataset=$DATA holdout=$RD/holdout student=models:/draftwheel-draft/1 output_dir=/work/i13g/exp/cand$NAME continue_to=${CONT:-192} mined_passes=${PASSES:-3} prompt_variants=${PV:-2} rehearsal_ratio=$R tracking=false ${EXTRA:-}
echo "TRAIN_S $(( $(date +%s) - s ))"
.venv/bin/python /work/x22/live_eval.py /work/i13g/roundv 2 /work/i13g/exp/cand$NAME
echo ALLDONE
