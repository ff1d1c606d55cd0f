"""Draft-vocabulary coverage of live code answers: the vocabulary alone, plus the request's prompt tokens,
plus the tokens the answer already produced."""
import sys, os
sys.path.insert(0, "/work/main")
import torch
from flows.monitor import read_records
from serving.models import load_model
state, version, spec = sys.argv[1], sys.argv[2], sys.argv[3]
os.environ["DRAFTWHEEL_HOME"] = state
recs = [r for r in read_records(os.path.join(state, "logs")) if r.slice == "code" and r.draft_id is not None
        and r.draft_id.version == version and r.mode == "draft"]
draft = load_model(spec).model
vocab = set(draft.draft_to_target.tolist())
n = inv = inp = inpo = 0
for r in recs:
    prompt = set(r.prompt_token_ids)
    seen = set()
    for t in r.output_token_ids:
        n += 1
        inv += t in vocab
        inp += (t in vocab) or (t in prompt)
        inpo += (t in vocab) or (t in prompt) or (t in seen)
        seen.add(t)
    ex = len(prompt - vocab)
print(f"{len(recs)} requests, {n} answer tokens: vocab {inv/n:.3f}, +prompt {inp/n:.3f}, +prompt+own output {inpo/n:.3f}")
import statistics
print("extra prompt ids per request (median):", statistics.median(len(set(r.prompt_token_ids) - vocab) for r in recs))
