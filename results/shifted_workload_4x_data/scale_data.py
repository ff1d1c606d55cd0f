"""Build a distill dataset = the round's mined one + greedy target outputs (64 tokens, as `draftwheel traffic`
serves) of extra code requests drawn from the same distribution. usage: scale_data.py ROUND_DISTILL_DIR OUT_DIR SEED..."""
import sys
sys.path.insert(0, "/work/main")
import torch
from datasets import load_from_disk
from mining.workloads import build_workload
from serving.models import load_model
from training.target_completions import target_traffic, save_rows
from draftwheel import home

src, out, seeds = sys.argv[1], sys.argv[2], [int(s) for s in sys.argv[3:]]
torch.set_num_threads(2)
mined = load_from_disk(src)
cols = ["prompt", "completion", "prompt_token_ids", "completion_token_ids", "slice", "weight"]
rows = [{c: r[c] for c in cols} for r in mined]
print(len(rows), "mined rows; slices", {s: sum(r["slice"] == s for r in rows) for s in set(r["slice"] for r in rows)},
      "weights", sorted(set(round(r["weight"], 3) for r in rows))[:10])
target = load_model(home.state_dir() / "models" / "smollm2-135m-instruct")
workload = [item for seed in seeds for item in build_workload("code", 80, seed)]
extra = target_traffic(target.model, target.tokenizer, workload, 64, batch_size=16)
save_rows(rows + [{c: r[c] for c in cols} for r in extra], out)
print(len(extra), "extra rows ->", out)
