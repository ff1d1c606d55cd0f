# experiment A: the round's mined rows + prompt-truncation variants (J=2), continuation off, 2 mined passes,
# rehearsal held at ~196 sequences; from v1, scored on the 40 live seed-2 code requests
set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false
rm -rf /work/i13g/exp; cp -a /work/i13g/round /work/i13g/exp
export DRAFTWHEEL_HOME=/work/i13g/exp
cd /work/main; export PYTHONPATH=/work/main
RD=$(ls -d /work/i13g/exp/flywheel/2*/datasets)
.venv/bin/python /work/x22/variants.py $RD/distill /work/i13g/exp/var2/distill 2
N=$(.venv/bin/python -c "from datasets import load_from_disk; print(len(load_from_disk('/work/i13g/exp/var2/distill')))")
R=$(.venv/bin/python -c "print(round(196/$N, 3))")
s=$(date +%s)
.venv/bin/draftwheel train eagle dataset=/work/i13g/exp/var2/distill holdout=$RD/holdout student=models:/draftwheel-draft/1 output_dir=/work/i13g/exp/candA continue_to=0 mined_passes=${PASSES:-2} rehearsal_ratio=$R tracking=false
echo "TRAIN_S $(( $(date +%s) - s ))"
.venv/bin/python /work/x22/live_eval.py /work/i13g/exp 2 models:/draftwheel-draft/2 /work/i13g/exp/candA
echo ALLDONE
