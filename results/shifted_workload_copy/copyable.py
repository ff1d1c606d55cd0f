"""Where does the draft miss on live code? Step-0 accuracy at answer positions a prompt-lookup (n-gram copy
from the context) would predict vs the rest. usage: copyable.py STATE VERSION DRAFT..."""
import sys, os
sys.path.insert(0, "/work/main")
import torch
from flows.monitor import read_records
from serving.models import load_model
from training.eagle_train import answer_chains
from draftwheel import home

state, version, drafts = sys.argv[1], sys.argv[2], sys.argv[3:]
os.environ["DRAFTWHEEL_HOME"] = state
torch.set_num_threads(2)
recs = [r for r in read_records(os.path.join(state, "logs")) if r.slice == "code" and r.draft_id is not None
        and r.draft_id.version == version and r.mode == "draft"]
target = load_model(home.state_dir() / "models" / "smollm2-135m-instruct")


def lookup(ids, end, n_max=3):
    """Prompt lookup's guess for the token after ids[:end]: the token after the latest earlier match of the
    longest suffix n-gram (n_max..1)."""
    for n in range(n_max, 0, -1):
        if end - n < 0:
            continue
        gram = ids[end - n:end]
        for s in range(end - n - 1, -1, -1):
            if ids[s:s + n] == gram:
                return ids[s + n]
    return None


for spec in drafts:
    draft = load_model(spec).model.attach_target(target.model).eval()
    stats = {"copy": [0, 0], "other": [0, 0]}
    for r in recs:
        logits, ref, mask = answer_chains(target.model, draft, r.prompt_token_ids, r.output_token_ids, 1)
        ids = list(r.prompt_token_ids) + list(r.output_token_ids)
        guess = draft.draft_to_target[logits[0][0].argmax(-1)].tolist()
        refl, m = ref[0].tolist(), mask[0].tolist()
        for j in range(len(guess) - 1):
            if not m[j] or j + 2 >= len(ids):
                continue
            want = refl[j + 1]
            kind = "copy" if lookup(ids, j + 2) == want else "other"
            stats[kind][0] += guess[j] == want
            stats[kind][1] += 1
    total = sum(v[1] for v in stats.values())
    print(spec, " ".join(f"{k}: {v[1] / total:.2f} of positions, draft step-0 acc {v[0] / v[1]:.3f}" for k, v in stats.items()), flush=True)
