import sys, os
sys.path.insert(0, "/work/main")
import torch
from flows.monitor import read_records
from serving.models import load_model
from training.eagle_train import answer_chains
from draftwheel import home
state, version, spec = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["DRAFTWHEEL_HOME"] = state
torch.set_num_threads(2)
recs = [r for r in read_records(os.path.join(state, "logs")) if r.slice == "code" and r.draft_id is not None
        and r.draft_id.version == version and r.mode == "draft"]
target = load_model(home.state_dir() / "models" / "smollm2-135m-instruct")
draft = load_model(spec).model.attach_target(target.model).eval()
t2d = draft.t2d
tot = {"pos": 0, "oov": 0, "oov_inprompt": 0, "step0_ok": 0, "step0_ok_next_oov": 0}
# teacher-forced step-0 accuracy by class of the reference token
cls = {"in_vocab": [0, 0], "oov_in_prompt": [0, 0], "oov_other": [0, 0], "after_oov": [0, 0]}
for r in recs:
    logits, ref, mask, extra = answer_chains(target.model, draft, r.prompt_token_ids, r.output_token_ids, 4)
    from training.eagle_ttt import targets
    g0 = targets(draft, logits[0].argmax(-1), extra)[0]  # slot j predicts token at j+2 = ref[j+1]
    refs = ref[0]; m = mask[0]
    P = set(r.prompt_token_ids)
    for j in range(g0.shape[0] - 1):
        if not m[j + 1]:
            continue
        tok = int(refs[j + 1]); prev = int(refs[j])
        c = "in_vocab" if t2d[tok] else ("oov_in_prompt" if tok in P else "oov_other")
        cls[c][0] += 1; cls[c][1] += int(g0[j]) == tok
        if not t2d[prev]:
            cls["after_oov"][0] += 1; cls["after_oov"][1] += int(g0[j]) == tok
for c, (n, ok) in cls.items():
    print(f"{c}: {n} positions, step-0 accuracy {ok / max(n,1):.3f}")
