"""Experiment: the round's mined rows + sampled branches of its code rows: the logged answer cut at a random
depth r (0 .. half its length), then M tokens sampled from the target at temperature T. The CLI's
continue_to then continues each branch greedily (it stops short of continue_to without an EOS).
usage: branches.py ROUND_DISTILL_DIR OUT_DIR N M T [VARIANTS_DIR]"""
import sys, time, random
sys.path.insert(0, "/work/main")
import torch
from datasets import load_from_disk
from serving.models import load_model
from training.eagle_train import generation_model
from training.target_completions import save_rows
from draftwheel import home

src, out, N, M, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
torch.set_num_threads(2)
torch.manual_seed(0)
rng = random.Random(0)
mined = load_from_disk(src)
cols = ["prompt", "completion", "prompt_token_ids", "completion_token_ids", "slice", "weight"]
rows = [{c: r[c] for c in cols} for r in mined]
target = load_model(home.state_dir() / "models" / "smollm2-135m-instruct")
model = generation_model(target, True)
tok = target.tokenizer
eos = model.generation_config.eos_token_id
eos = set(eos if isinstance(eos, list) else [eos]) | {tok.eos_token_id}
extra = []
started = time.perf_counter()
for r in rows:
    if r["slice"] != "code":
        continue
    answer = r["completion_token_ids"]
    for _ in range(N):
        depth = rng.randint(0, max(0, len(answer) // 2))
        ids = torch.tensor([r["prompt_token_ids"] + answer[:depth]])
        with torch.no_grad():
            outp = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=True, temperature=T, top_k=0,
                                  top_p=1.0, max_new_tokens=M, pad_token_id=tok.eos_token_id)
        sampled = outp[0, ids.shape[1]:].tolist()
        if any(t in eos for t in sampled):
            continue  # an answer that ends inside the branch gives nothing to continue
        completion = answer[:depth] + sampled
        extra.append({"prompt": r["prompt"], "completion": tok.decode(completion), "prompt_token_ids": r["prompt_token_ids"],
                      "completion_token_ids": completion, "slice": "code", "weight": 1.0})
print(f"{len(rows)} mined rows; {len(extra)} branches; GEN_S {time.perf_counter() - started:.1f}", flush=True)
save_rows(rows + extra, out)
