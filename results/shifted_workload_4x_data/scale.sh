# offline: the round's mined data + 240 more code requests (seeds 3 5 6) -> train eagle from v1 as the round does -> live eval
set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false
rm -rf /work/i13g/exp; cp -a /work/i13g/round /work/i13g/exp
export DRAFTWHEEL_HOME=/work/i13g/exp
cd /work/main; export PYTHONPATH=/work/main
RD=$(ls -d /work/i13g/exp/flywheel/2*/datasets)
s=$(date +%s)
.venv/bin/python /work/x22/scale_data.py $RD/distill /work/i13g/exp/scale4/distill 3 5 6
echo "GEN_S $(( $(date +%s) - s ))"
s=$(date +%s)
.venv/bin/draftwheel train eagle dataset=/work/i13g/exp/scale4/distill holdout=$RD/holdout student=models:/draftwheel-draft/1 output_dir=/work/i13g/exp/cand4x tracking=false
echo "TRAIN_S $(( $(date +%s) - s ))"
.venv/bin/python /work/x22/live_eval.py /work/i13g/exp 2 models:/draftwheel-draft/1 models:/draftwheel-draft/2 /work/i13g/exp/cand4x
echo ALLDONE
