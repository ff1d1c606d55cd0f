set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true DRAFTWHEEL_HOME=/work/i13g/roundv
cd /work/main; export PYTHONPATH=/work/main
P=results/shifted_workload_library/live_code_prompts_seed2_first16.jsonl
OLD=$(ls -d /work/i13g/round/models/candidates/*/)
mkdir -p /work/x22/bench2
B=".venv/bin/draftwheel bench --chat --min-path-prob 0.25 --max-new-tokens 64 --prompts $P"
$B --draft models:/draftwheel-draft/1 --out /work/x22/bench2/bench_code_v1.json
$B --draft $OLD --out /work/x22/bench2/bench_code_v2_without_variants.json
$B --draft models:/draftwheel-draft/2 --out /work/x22/bench2/bench_code_v2.json
$B --draft models:/draftwheel-draft/2 --suffix-tier --out /work/x22/bench2/bench_code_v2_hybrid.json
echo ALLDONE
