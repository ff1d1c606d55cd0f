# usage: NAME=.. J=.. CONT=.. PASSES=.. REH=<rehearsal sequences> bash exp.sh   (state /work/i13g/exp: a copy of the
# state after the round, /work/i13g/round; the var$J data is built if missing). The runs in docs/results.md:
# A: J=2 CONT=0 PASSES=2 REH=196; B: J=2 CONT=192 PASSES=4 REH=196; B3: J=2 CONT=192 PASSES=3 REH=196;
# J3: J=3 CONT=192 PASSES=3 REH=196. prompt_variants=0: the variants are in the data already (A, B, B3 ran
# before configs/eagle.yaml shipped prompt_variants, so without it too)
set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true PREFECT_SERVER_ANALYTICS_ENABLED=false
export DRAFTWHEEL_HOME=/work/i13g/exp
cd /work/main; export PYTHONPATH=/work/main
RD=$(ls -d /work/i13g/exp/flywheel/2*/datasets)
[ -d /work/i13g/exp/var$J/distill ] || .venv/bin/python /work/x22/variants.py $RD/distill /work/i13g/exp/var$J/distill $J
N=$(.venv/bin/python -c "from datasets import load_from_disk; print(len(load_from_disk('/work/i13g/exp/var$J/distill')))")
R=$(.venv/bin/python -c "print(round(${REH:-196}/$N, 3))")
s=$(date +%s)
.venv/bin/draftwheel train eagle dataset=/work/i13g/exp/var$J/distill holdout=$RD/holdout student=models:/draftwheel-draft/1 output_dir=/work/i13g/exp/cand$NAME continue_to=$CONT mined_passes=$PASSES prompt_variants=0 rehearsal_ratio=$R tracking=false
echo "TRAIN_S $(( $(date +%s) - s ))"
.venv/bin/python /work/x22/live_eval.py /work/i13g/exp 2 /work/i13g/exp/cand$NAME
echo ALLDONE
