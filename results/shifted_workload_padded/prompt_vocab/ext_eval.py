"""Prototype: per-request vocabulary extension with the prompt's out-of-vocabulary tokens (target head rows).
usage: ext_eval.py STATE SERVED_VERSION DRAFT [scales...]"""
import sys, os
sys.path.insert(0, "/work/main")
import torch
from flows.monitor import read_records
from serving.models import load_model
from serving.eagle import Eagle3Draft
from training.eagle_ttt import served_walk
from training.eagle_train import answer_chains
from draftwheel import home

state, version, spec = sys.argv[1], sys.argv[2], sys.argv[3]
scales = [float(s) for s in sys.argv[4:]] or [0.0, 1.0]
os.environ["DRAFTWHEEL_HOME"] = state
torch.set_num_threads(2)
recs = [r for r in read_records(os.path.join(state, "logs")) if r.slice == "code" and r.draft_id is not None
        and r.draft_id.version == version and r.mode == "draft"]
target = load_model(home.state_dir() / "models" / "smollm2-135m-instruct")
draft = load_model(spec).model.attach_target(target.model).eval()
W_t = target.model.lm_head.weight.detach()
base_d2t = draft.draft_to_target.clone()
W_d = draft.lm_head.weight.detach()
ratio = float(W_d.norm(dim=1).mean() / W_t[base_d2t].norm(dim=1).mean())
print("row norm ratio draft/target", ratio)

class Ext(Eagle3Draft):
    ext_ids = None
    @property
    def draft_to_target(self):
        return self.ext_ids

for scale in scales:
    emitted = steps = 0
    for r in recs:
        vocab = set(base_d2t.tolist())
        extra = sorted(set(r.prompt_token_ids) - vocab) if scale > 0 else []
        W = torch.cat([W_d, W_t[extra] * (ratio * scale)]) if extra else W_d
        ids = torch.cat([base_d2t, torch.tensor(extra, dtype=torch.long)]) if extra else base_d2t
        draft.__class__ = Ext
        draft.ext_ids = ids
        draft.logits = lambda h, W=W: draft.norm(h) @ W.T.to(h.dtype)
        logits, ref, mask = answer_chains(target.model, draft, r.prompt_token_ids, r.output_token_ids, 4)
        e, s = served_walk(logits, ref, draft, mask)
        emitted, steps = emitted + e, steps + s
    print(f"scale {scale}: served-walk MAL {emitted / steps:.3f}", flush=True)
