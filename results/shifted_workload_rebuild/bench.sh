set -x
export HF_HUB_OFFLINE=1 MLFLOW_DISABLE_TELEMETRY=true DRAFTWHEEL_HOME=/work/i13g/round
cd /work/main; export PYTHONPATH=/work/main
P=results/shifted_workload_library/live_code_prompts_seed2_first16.jsonl
mkdir -p /work/x22/bench
for v in 1 2; do
  .venv/bin/draftwheel bench --chat --min-path-prob 0.25 --max-new-tokens 64 --prompts $P --draft models:/draftwheel-draft/$v --out /work/x22/bench/bench_code_v$v.json
done
.venv/bin/draftwheel bench --chat --min-path-prob 0.25 --max-new-tokens 64 --prompts $P --draft models:/draftwheel-draft/2 --suffix-tier --out /work/x22/bench/bench_code_v2_hybrid.json
.venv/bin/draftwheel monitor run_flywheel=false
.venv/bin/draftwheel status
echo ALLDONE
