D=/work/i13g/exp/flywheel/20261204T141819Z/datasets/distill
while [ ! -f /work/x25/queue2.done ]; do sleep 5; done
NAME=LR5P4 DATA=$D CONT=96 PASSES=4 PV=2 EXTRA="prompt_renames=2 learning_rate=5e-3" flock /tmp/draftwheel-heavy.lock bash /work/x23/arm.sh > /work/x25/armLR5P4.log 2>&1
AFTER_TS=1796416000 flock /tmp/draftwheel-heavy.lock /work/main/.venv/bin/python /work/x25/val_eval.py /work/i13g/val 2 /work/i13g/exp/candLR5P4 2>&1 | grep MAL > /work/x25/valLR5P4.txt
echo done > /work/x25/queue3.done
