import sys, os
sys.path.insert(0, "/work/main")
import torch
from flows.monitor import read_records
from serving.models import load_model
from training.eagle_train import answer_chains
state, version, spec = "/work/i13g/roundv", "2", sys.argv[1]
os.environ["DRAFTWHEEL_HOME"] = state
torch.set_num_threads(2)
recs = [r for r in read_records(os.path.join(state, "logs")) if r.slice == "code" and r.draft_id is not None
        and r.draft_id.version == version and r.mode == "draft"]
target = load_model(state + "/models/smollm2-135m-instruct")
draft = load_model(spec).model.attach_target(target.model).eval()
Vd = draft.c.draft_vocab_size
scales = [1]
ok = {s: [0, 0, 0] for s in scales}; n = [0, 0]
for r in recs:
    logits, ref, mask, extra = answer_chains(target.model, draft, r.prompt_token_ids, r.output_token_ids, 4)
    ids = draft.vocab_ids(extra)[0]
    l0 = logits[0][0]
    m = mask[0, 1:l0.shape[0] + 1]
    refs = ref[0, 1:l0.shape[0] + 1]
    oov = ~draft.t2d[refs]
    n[0] += int(m.sum()); n[1] += int((m & oov).sum())
    for s in scales:
        l = l0.clone(); l[:, Vd:] *= s
        g = ids[l.argmax(-1)]
        hit = (g == refs) & m
        ok[s][0] += int(hit.sum()); ok[s][1] += int((hit & oov).sum()); ok[s][2] += int(((g != ids[l0[:, :Vd].argmax(-1)]) & m).sum())
for s in scales:
    print(f"scale {s}: step-0 acc {ok[s][0]/n[0]:.3f} (oov {ok[s][1]}/{n[1]}), picks changed {ok[s][2]}")
