import sys, os, json
sys.path.insert(0, "/work/main")
import torch
from datasets import load_from_disk
from flows.monitor import read_records
from serving.models import load_model
from serving.eagle import vocab_from_counts
state="/work/i13g/roundv"
recs = [r for r in read_records(os.path.join(state, "logs")) if r.slice == "code" and r.draft_id is not None and r.draft_id.version == "2" and r.mode == "draft"]
out = torch.tensor([t for r in recs for t in r.output_token_ids])
d = load_from_disk("/work/i13g/exp/flywheel/20261204T141819Z/datasets/distill")
print(d.column_names, len(d))
V = 49152
def counts(lists):
    return torch.bincount(torch.tensor([t for l in lists for t in l]), minlength=V)[:V].double()
oc = counts(d["completion_token_ids"]); pc = counts(d["prompt_token_ids"])
v2 = load_model("/work/i13g/exp/candR2c96x2").model
old = v2.t2d.double()
print("v2 vocab cov", float(v2.t2d[out].float().mean()))
print("any token seen in mined outputs", float((oc[out] > 0).float().mean()), "in mined prompts or outputs", float(((oc + pc)[out] > 0).float().mean()))
for name, c in [("outputs", oc), ("outputs+prompts", oc + pc), ("outputs+0.5prompts", oc + 0.5 * pc)]:
    for size in (4096, 6144, 8192):
        d2t, t2d = vocab_from_counts(c + 0.5 * old + 1e-6 * (V - torch.arange(V)).double() / V, size)
        print(name, size, "live cov", float(t2d[out].float().mean()))
