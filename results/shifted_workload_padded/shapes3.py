import sys, time, random
sys.path.insert(0, "/work/main")
import torch
from serving.eagle import Eagle3Config, Eagle3Draft
from serving.models import load_model
from training.eagle_ttt import unrolled_loss
torch.manual_seed(0); random.seed(0)
target = load_model("/work/i13g/val/models/smollm2-135m-instruct").model.eval()
draft = Eagle3Draft(Eagle3Config.for_target(target.config, draft_vocab_size=4096)).attach_target(target).train()
opt = torch.optim.AdamW(draft.parameters(), lr=1e-4)
H = target.config.hidden_size
lm = target.get_output_embeddings().weight.detach()
def step(T, B=8):
    ids = torch.randint(0, 49152, (B, T)); aux = torch.randn(B, T, 3 * H); hid = torch.randn(B, T, H)
    mask = torch.ones(B, T, dtype=torch.bool)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss, _ = unrolled_loss(draft, ids, aux, hid, mask, lm, 3, 0.8, 0.5, 0.3)
    loss.backward(); opt.step(); opt.zero_grad()
widths = [random.randint(100, 300) for _ in range(30)]
r64 = [-(-w // 64) * 64 for w in widths]
for name, ws in [("fixed 200", [200] * 30), ("rounded to 64", r64), ("rounded to 64, sorted", sorted(r64)), ("varying sorted", sorted(widths)), ("fixed 256", [256] * 30), ("fixed 128", [128]*30)]:
    t = time.perf_counter()
    for w in ws: step(w)
    print(f"{name}: {(time.perf_counter() - t) / len(ws):.3f} s/step, mean width {sum(ws)/len(ws):.0f}", flush=True)
