import sys, time
sys.path.insert(0, "/work/main")
import torch
from torch.profiler import profile, ProfilerActivity
from serving.eagle import Eagle3Config, Eagle3Draft
from serving.models import load_model
from serving.reference import default_target_dir
from training.eagle_ttt import unrolled_loss
torch.manual_seed(0)
import os
os.environ["DRAFTWHEEL_HOME"] = "/work/i13g/val"
target = load_model("/work/i13g/val/models/smollm2-135m-instruct").model.eval()
draft = Eagle3Draft(Eagle3Config.for_target(target.config, draft_vocab_size=4096)).attach_target(target).train()
opt = torch.optim.AdamW(draft.parameters(), lr=1e-4)
B, T = 8, 190
H = target.config.hidden_size
ids = torch.randint(0, 49152, (B, T)); aux = torch.randn(B, T, 3 * H); hid = torch.randn(B, T, H)
mask = torch.ones(B, T, dtype=torch.bool)
lm = target.get_output_embeddings().weight.detach()
def step():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = unrolled_loss(draft, ids, aux, hid, mask, lm, 3, 0.8, 0.5, 0.3)
    loss.backward(); opt.step(); opt.zero_grad()
for _ in range(3): step()
t = time.perf_counter()
for _ in range(5): step()
print("step s", (time.perf_counter() - t) / 5)
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for _ in range(3): step()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
