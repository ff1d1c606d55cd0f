D=/work/i13g/exp/flywheel/20261204T141819Z/datasets/distill
run() { NAME=$1 DATA=$D CONT=96 PASSES=$2 PV=2 EXTRA="$3" flock /tmp/draftwheel-heavy.lock bash /work/x23/arm.sh > /work/x25/arm$1.log 2>&1
  AFTER_TS=1796416000 flock /tmp/draftwheel-heavy.lock /work/main/.venv/bin/python /work/x25/val_eval.py /work/i13g/val 2 /work/i13g/exp/cand$1 2>&1 | grep MAL > /work/x25/val$1.txt; }
while pgrep -f "output_dir=/work/i13g/exp/candPAD4" > /dev/null || pgrep -f "exp/candPAD4$" > /dev/null; do sleep 5; done
AFTER_TS=1796416000 flock /tmp/draftwheel-heavy.lock /work/main/.venv/bin/python /work/x25/val_eval.py /work/i13g/val 2 /work/i13g/exp/candPAD4 2>&1 | grep MAL > /work/x25/valPAD4.txt
run R3P3 3 "prompt_renames=3"
run CS1P3 3 "prompt_renames=2 ttt_chain_share=1.0"
run LR5P3 3 "prompt_renames=2 learning_rate=5e-3"
echo QUEUE_DONE > /work/x25/queue.done
