"""bfloat16 autocast vs float32 on this CPU, for what the eagle trainer does: the batched target feature
forward (SmolLM2-135M, 8 sequences x 256 tokens), one forward+backward of a draft-head-sized layer, and
one whole training step of an EAGLE-3 draft at a round's shapes (8 x 300 positions, 3 unroll steps,
the distillation loss, AdamW).

Why: `bf16: auto` (serving.precision.resolve_bf16) picks bfloat16 only on AMX-BF16 CPUs. This prints
the ratio that decides it on the machine at hand, measured in one run (3 timed repeats after a warm-up; 1 for the training step).

    flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/bf16_speed.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from draftwheel.home import apply_offline_defaults
from serving.eagle import Eagle3Config, Eagle3Draft
from serving.models import load_model
from serving.precision import cpu_has_amx_bf16
from serving.reference import default_target_dir
from training.eagle_ttt import unrolled_loss


def seconds_per_call(fn: Callable[[], object], repeats: int = 3) -> float:
    fn()  # warm-up: oneDNN picks and caches its kernels on the first call
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    apply_offline_defaults()
    torch.manual_seed(0)
    target = load_model(str(default_target_dir())).model.eval()
    ids = torch.randint(0, target.config.vocab_size, (8, 256))
    head = torch.nn.Linear(target.config.hidden_size, 4096)
    x = torch.randn(2048, target.config.hidden_size, requires_grad=True)

    def feature_forward(bf16: bool) -> None:
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            target(input_ids=ids, output_hidden_states=True)

    def head_step(bf16: bool) -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = head(torch.relu(x)).float().logsumexp(-1).sum()
        loss.backward()

    draft = Eagle3Draft(Eagle3Config.for_target(target.config, draft_vocab_size=4096)).attach_target(target).train()
    optimizer = torch.optim.AdamW(draft.parameters(), lr=1e-4)
    batch_ids = torch.randint(0, target.config.vocab_size, (8, 300))
    hidden_size = target.config.hidden_size
    batch_aux, batch_hidden = torch.randn(8, 300, 3 * hidden_size), torch.randn(8, 300, hidden_size)
    lm_head = target.get_output_embeddings().weight.detach()

    def training_step(bf16: bool) -> None:  # as training.eagle_train.EagleTrainer.compute_loss, plus the update
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss, _ = unrolled_loss(draft, batch_ids, batch_aux, batch_hidden, torch.ones(8, 300, dtype=torch.bool),
                                    lm_head, 3, 0.8)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    amx = cpu_has_amx_bf16()
    print(f"cpu has AMX-BF16: {amx} (bf16: auto -> {'bfloat16' if amx else 'float32'})")
    for name, fn, repeats in (("target feature forward 8x256", feature_forward, 3),
                              ("head fwd+bwd 2048x576->4096", head_step, 3),
                              ("eagle training step 8x300, 3 unroll steps", training_step, 1)):
        fp32, bf16 = seconds_per_call(lambda: fn(False), repeats), seconds_per_call(lambda: fn(True), repeats)
        print(f"{name}: float32 {fp32:.3f} s, bfloat16 {bf16:.3f} s -> bfloat16 is {fp32 / bf16:.2f}x float32's speed")


if __name__ == "__main__":
    main()
