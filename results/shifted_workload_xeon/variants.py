"""Experiment: the round's mined rows + prompt-truncation variants of its code rows (the user message's body
cut j lines short, j = 1..J), each answered by the target greedily (64 tokens, as traffic is served).
usage: variants.py ROUND_DISTILL_DIR OUT_DIR J"""
import sys, time
sys.path.insert(0, "/work/main")
import torch
from datasets import load_from_disk
from serving.models import load_model
from training.eagle_train import generation_model
from training.target_completions import target_traffic, save_rows
from draftwheel import home

src, out, J = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(2)
mined = load_from_disk(src)
cols = ["prompt", "completion", "prompt_token_ids", "completion_token_ids", "slice", "weight"]
rows = [{c: r[c] for c in cols} for r in mined]
USER, END = "<|im_start|>user\n", "<|im_end|>"


def user_message(text):
    start = text.rfind(USER)
    end = text.find(END, start)
    return text[start + len(USER):end] if start >= 0 and end > start else None


def cut(message, j):
    lines = message.split("\n")
    fence = lines[-1].strip() == "```"
    body = lines[:-1] if fence else lines
    if len(body) - j < 4:  # keep the instruction, a blank, a signature and one more line
        return None
    return "\n".join(body[:-j] + (lines[-1:] if fence else []))


workload = []
for r in rows:
    if r["slice"] != "code":
        continue
    message = user_message(r["prompt"])
    for j in range(1, J + 1):
        variant = cut(message, j) if message else None
        if variant:
            workload.append({"prompt": variant, "slice": "code"})
print(len(rows), "mined rows;", len(workload), "variants", flush=True)
target = load_model(home.state_dir() / "models" / "smollm2-135m-instruct")
started = time.perf_counter()
extra = target_traffic(generation_model(target, False), target.tokenizer, workload, 64, batch_size=32)
print(f"GEN_S {time.perf_counter() - started:.1f}; {sum(len(r['completion_token_ids']) for r in extra)} tokens")
save_rows(rows + [{c: r[c] for c in cols} for r in extra], out)
print(len(extra), "variant rows ->", out)
