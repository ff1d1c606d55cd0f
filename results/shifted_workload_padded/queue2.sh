D=/work/i13g/exp/flywheel/20261204T141819Z/datasets/distill
while [ ! -f /work/x25/queue.done ]; do sleep 5; done
NAME=TTT4P3 DATA=$D CONT=96 PASSES=3 PV=2 EXTRA="prompt_renames=2 ttt_steps=4" flock /tmp/draftwheel-heavy.lock bash /work/x23/arm.sh > /work/x25/armTTT4P3.log 2>&1
AFTER_TS=1796416000 flock /tmp/draftwheel-heavy.lock /work/main/.venv/bin/python /work/x25/val_eval.py /work/i13g/val 2 /work/i13g/exp/candTTT4P3 2>&1 | grep MAL > /work/x25/valTTT4P3.txt
echo done > /work/x25/queue2.done
