set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false
export DRAFTWHEEL_HOME=/work/i13g/exp
cd /work/main; export PYTHONPATH=/work/main
.venv/bin/python /work/x22/live_eval.py /work/i13g/exp 2 models:/draftwheel-draft/1 models:/draftwheel-draft/2 /work/i13g/exp/cand4x
RD=$(ls -d /work/i13g/exp/flywheel/2*/datasets)
s=$(date +%s)
.venv/bin/draftwheel train eagle --config configs/eagle.yaml dataset=/work/i13g/exp/scale4/distill holdout=$RD/holdout student=models:/draftwheel-draft/1 output_dir=/work/i13g/exp/cand4x_round tracking=false
echo "TRAIN_S $(( $(date +%s) - s ))"
.venv/bin/python /work/x22/live_eval.py /work/i13g/exp 2 /work/i13g/exp/cand4x_round
echo ALLDONE
