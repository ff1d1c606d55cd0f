"""Score eagle3 drafts on the live code requests a given version served (serving's greedy walk, k=4).
usage: live_eval.py STATE SERVED_VERSION DRAFT_DIR_OR_URI [...]"""
import sys, os
sys.path.insert(0, "/work/main")
import torch
from flows.monitor import read_records
from serving.models import load_model
from training.eagle_ttt import served_walk
from training.eagle_train import answer_chains
from draftwheel import home

state, version, drafts = sys.argv[1], sys.argv[2], sys.argv[3:]
os.environ["DRAFTWHEEL_HOME"] = state
torch.set_num_threads(2)
recs = [r for r in read_records(os.path.join(state, "logs")) if r.slice == "code" and r.draft_id is not None and r.ts > float(os.environ.get("AFTER_TS", "0"))
        and r.draft_id.version == version and r.mode == "draft"]
logged = (sum(r.accepted_tokens for r in recs) + sum(r.verify_steps for r in recs)) / sum(r.verify_steps for r in recs)
print(f"{len(recs)} live code requests served by v{version}; logged MAL {logged:.3f}")
target = load_model(home.state_dir() / "models" / "smollm2-135m-instruct")
for spec in drafts:
    draft = load_model(spec).model.attach_target(target.model).eval()
    emitted = steps = 0
    for r in recs:
        logits, ref, mask = answer_chains(target.model, draft, r.prompt_token_ids, r.output_token_ids, 4)
        e, s = served_walk(logits, ref, draft, mask)
        emitted, steps = emitted + e, steps + s
    print(f"{spec}: served-walk MAL {emitted / steps:.3f}", flush=True)
