"""EAGLE-3 training on tiny models: the unrolled loss, the vocabulary, the trainer end to end.

The tiny target is a random 2-layer Llama; its greedy completions are the data (as mined logs are).
A draft trained on them must raise the teacher-forced implied mean accepted length over its untrained
start on the same sequences, and what it saves must load into the Engine with greedy output equal to
the target's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import draftwheel.training.eagle_ttt as eagle_ttt
from draftwheel.serving.engine.eagle import Eagle3Config, Eagle3Draft, vocab_from_counts
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.loading import load_model
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.testing import build_tokenizer, tiny_llama
from draftwheel.training import common
from draftwheel.training.eagle_train import (EagleConfig, load_sequences, mined_epoch, rehearsal_count,
                                             rehearsal_source, train_eagle)
from draftwheel.training.eagle_ttt import (_SoftCrossEntropy, chain_acceptance, chain_slots, implied_mal, served_walk, ttt_attention,
                                ttt_loss, ttt_mask, unroll)


def test_ttt_mask_is_causal_then_diagonal():
    mask = ttt_mask(3, 2)
    assert mask.shape == (3, 9)
    assert mask[:, :3].tolist() == [[True, False, False], [True, True, False], [True, True, True]]
    assert mask[:, 3:6].tolist() == torch.eye(3, dtype=torch.bool).tolist()
    assert mask[:, 6:].tolist() == torch.eye(3, dtype=torch.bool).tolist()


def test_ttt_attention_equals_attention_under_the_written_out_mask():
    """The per-slot diagonal shortcut computes exactly the masked attention over the whole unrolled cache."""
    torch.manual_seed(0)
    b, nh, nkv, n, d = 2, 4, 2, 5, 8
    q = torch.randn(b, nh, n, d)
    keys = [torch.randn(b, nkv, n, d) for _ in range(3)]
    values = [torch.randn(b, nkv, n, d) for _ in range(3)]
    expected = F.scaled_dot_product_attention(q, torch.cat(keys, 2), torch.cat(values, 2),
                                              attn_mask=ttt_mask(n, 2), enable_gqa=True)
    assert torch.allclose(ttt_attention(q, keys, values), expected, atol=1e-5)
    # At step 0 it is plain causal attention.
    causal = F.scaled_dot_product_attention(q, keys[0], values[0], is_causal=True, enable_gqa=True)
    assert torch.allclose(ttt_attention(q, keys[:1], values[:1]), causal, atol=1e-5)


def test_sampled_chains_unroll_to_exactly_what_the_full_unroll_gives_them():
    """Past step 0 the chains are independent, so running only a sample of them changes nothing for
    the sampled ones: logits, and the loss over those chains with its gradient."""
    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0)
    torch.manual_seed(0)
    draft = Eagle3Draft(Eagle3Config.for_target(target.config, draft_vocab_size=48)).attach_target(target)
    ids = torch.randint(0, target.config.vocab_size, (2, 9))
    aux = torch.randn(2, 9, 3 * target.config.hidden_size)
    slots = torch.tensor([1, 4, 6, 7])
    full = unroll(draft, ids, aux, 3)
    sampled = unroll(draft, ids, aux, 3, slots)
    assert torch.allclose(sampled[0], full[0])
    for s in (1, 2):
        assert sampled[s].shape == (2, 4, 48)
        assert torch.allclose(sampled[s], full[s][:, slots], atol=1e-5)
    # The loss only scores chains that stay inside the sequence: slot 7 at step 2 would predict past it.
    teacher = torch.log_softmax(torch.randn(2, 9, 48), -1)
    mask = torch.rand(2, 9) > 0.2
    loss, per_step = ttt_loss(sampled, teacher, mask, decay=0.8, slots=slots)
    expected = []
    for s in (0, 1, 2):  # the definition over the sampled chains: slot j at step s vs teacher position j+1+s
        chains = torch.arange(8) if s == 0 else slots
        chains = chains[chains + 1 + s <= 8]
        p_log = teacher[:, chains + 1 + s]
        kl = (p_log.exp() * (p_log - torch.log_softmax(full[s][:, chains], -1))).sum(-1)
        m = mask[:, chains + 1 + s].float()
        expected.append(float((kl * m).sum() / m.sum()))
    assert per_step == pytest.approx(expected, rel=1e-4)
    loss.backward()
    assert all(p.grad is not None for p in draft.parameters() if p.requires_grad)


def test_chain_slots_samples_a_sorted_share_without_repeats():
    assert chain_slots(10, 1.0) is None
    slots = chain_slots(10, 0.45, generator=torch.Generator().manual_seed(0))
    assert len(slots) == 5 and slots.tolist() == sorted(set(slots.tolist())) and 0 <= int(slots.min()) <= int(slots.max()) < 10
    assert len(chain_slots(3, 0.01)) == 1


def test_soft_cross_entropy_matches_torch_in_value_and_gradient():
    torch.manual_seed(0)
    logits = torch.randn(3, 4, 9, requires_grad=True)
    p = torch.softmax(torch.randn(3, 4, 9), -1)
    upstream = torch.randn(3, 4)
    ours = _SoftCrossEntropy.apply(logits, p)
    (ours * upstream).sum().backward()
    ours_grad = logits.grad.clone()
    logits.grad = None
    reference = F.cross_entropy(logits.reshape(-1, 9), p.reshape(-1, 9), reduction="none").reshape(3, 4)
    (reference * upstream).sum().backward()
    assert torch.allclose(ours, reference, atol=1e-6)
    assert torch.allclose(ours_grad, logits.grad, atol=1e-6)


def test_ttt_loss_zero_when_draft_equals_teacher_and_positive_otherwise():
    teacher = torch.log_softmax(torch.randn(2, 6, 5), -1)  # [B, T, Vd]
    # The draft's slot j at step s is scored against teacher position j+1+s.
    perfect = [teacher[:, 1 + s:].clone() for s in range(2)]
    perfect = [torch.cat([p, torch.zeros(2, s, 5)], 1) for s, p in enumerate(perfect)]  # pad to n = T-1
    mask = torch.ones(2, 6, dtype=torch.bool)
    loss, per_step = ttt_loss(perfect, teacher, mask, decay=0.8)
    assert float(loss) == pytest.approx(0.0, abs=1e-5)
    wrong = [torch.randn(2, 5, 5) for _ in range(2)]
    assert float(ttt_loss(wrong, teacher, mask, decay=0.8)[0]) > 0.01


def test_ttt_loss_is_the_masked_weighted_forward_kl():
    torch.manual_seed(0)
    teacher = torch.log_softmax(torch.randn(2, 7, 11), -1)  # [B, T, Vd]
    logits = [torch.randn(2, 6, 11) for _ in range(3)]
    mask = torch.rand(2, 7) > 0.3
    loss, per_step = ttt_loss(logits, teacher, mask, decay=0.5)
    expected = []
    for s, step in enumerate(logits):  # the definition, written out: sum p (log p - log q) per scored slot
        width = 6 - s
        p_log = teacher[:, 1 + s: 1 + s + width]
        kl = (p_log.exp() * (p_log - torch.log_softmax(step[:, :width], -1))).sum(-1)
        m = mask[:, 1 + s: 1 + s + width].float()
        expected.append(float((kl * m).sum() / m.sum()))
    assert per_step == pytest.approx(expected, rel=1e-5)
    weights = [1.0, 0.5, 0.25]
    assert float(loss) == pytest.approx(sum(w * e for w, e in zip(weights, expected)) / sum(weights), rel=1e-5)


def test_rejection_is_one_minus_the_overlap_of_draft_and_target():
    """0 where the draft's q equals the target's p, 1 where they share no token, and in between the mass
    of q that sampling would reject: q = (0.5, 0.5, 0), p = (1, 0, 0) keeps 0.5."""
    from draftwheel.training.eagle_ttt import rejection

    p = torch.tensor([[0.7, 0.2, 0.1], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1], [1e-9, 1.0, 1e-9], [0.5, 0.5, 1e-12]]))
    assert rejection(logits, p).tolist() == pytest.approx([0.0, 1.0, 0.5], abs=1e-6)


def test_acceptance_weight_adds_the_weighted_rejection_chance_and_its_gradient():
    from draftwheel.training.eagle_ttt import rejection

    torch.manual_seed(1)
    teacher = torch.log_softmax(torch.randn(2, 5, 7), -1)  # [B, T, Vd]
    logits = [torch.randn(2, 4, 7, requires_grad=True)]
    mask = torch.ones(2, 5, dtype=torch.bool)
    kl, _ = ttt_loss(logits, teacher, mask, decay=0.8)
    both, _ = ttt_loss(logits, teacher, mask, decay=0.8, acceptance_weight=2.0)
    expected = 2.0 * rejection(logits[0], teacher[:, 1:].exp()).mean()
    assert float(both - kl) == pytest.approx(float(expected), rel=1e-5)
    (grad,) = torch.autograd.grad(both - kl, logits)
    assert float(grad.abs().sum()) > 0  # the term trains the draft, not only reports


def test_teacher_temperature_sharpens_the_target_toward_its_argmax():
    """Greedy acceptance asks only for the target's argmax: below temperature 1 the distribution the
    draft learns keeps that argmax, puts more mass on it, and tends to the one-hot argmax, so the
    unrolled loss tends to the cross-entropy against the target's greedy token."""
    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0)
    torch.manual_seed(0)
    draft = Eagle3Draft(Eagle3Config.for_target(target.config, draft_vocab_size=48)).attach_target(target)
    head = target.get_output_embeddings().weight.detach()
    hidden = 3.0 * torch.randn(2, 9, target.config.hidden_size)
    plain = eagle_ttt.teacher_log_probs(hidden, head, draft)
    sharp = eagle_ttt.teacher_log_probs(hidden, head, draft, temperature=0.3)
    assert torch.equal(sharp.argmax(-1), plain.argmax(-1))
    assert bool((sharp.max(-1).values > plain.max(-1).values).all())

    ids = torch.randint(0, target.config.vocab_size, (2, 9))
    aux = torch.randn(2, 9, 3 * target.config.hidden_size)
    mask = torch.ones(2, 9, dtype=torch.bool)
    cold, logits = eagle_ttt.unrolled_loss(draft, ids, aux, hidden, mask, head, steps=1, decay=0.8, temperature=1e-5)
    greedy = plain.argmax(-1)[:, 1:]  # slot j predicts position j+1
    hard = F.cross_entropy(logits[0].reshape(-1, 48), greedy.reshape(-1))
    assert float(cold.detach()) == pytest.approx(float(hard.detach()), rel=1e-4)
    warm, _ = eagle_ttt.unrolled_loss(draft, ids, aux, hidden, mask, head, steps=1, decay=0.8)
    assert float(warm.detach()) != pytest.approx(float(hard.detach()), rel=1e-2)


def test_collate_pads_to_a_multiple_and_the_padding_changes_no_loss_or_gradient(monkeypatch):
    """Batch widths round up to PAD_TO_MULTIPLE (few distinct matmul shapes: steps of a changing width
    were slow, eagle_train.PAD_TO_MULTIPLE); the extra positions are masked and come after every real one,
    so the loss and its gradients are what the tightest padding gives."""
    import draftwheel.training.eagle_train as eagle_train

    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0)
    torch.manual_seed(0)
    draft = Eagle3Draft(Eagle3Config.for_target(target.config, draft_vocab_size=48)).attach_target(target)
    h = target.config.hidden_size
    rows = [{"input_ids": list(range(5, 5 + n)), "aux": torch.randn(n, 3 * h), "hidden": torch.randn(n, h),
             "argmax": torch.zeros(n, dtype=torch.long), "start": 2} for n in (7, 11)]
    head = target.get_output_embeddings().weight.detach()

    def loss_and_grads(batch):
        draft.zero_grad()
        loss, _ = eagle_ttt.unrolled_loss(draft, batch["input_ids"], batch["aux"], batch["hidden"], batch["mask"],
                                          head, steps=3, decay=0.8)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in draft.parameters()]

    padded = eagle_train.collate(rows)
    assert padded["input_ids"].shape[1] == eagle_train.PAD_TO_MULTIPLE >= 11
    assert padded["mask"].sum(1).tolist() == [7 - 1 - 2, 11 - 1 - 2]  # from `start` to the last position but one
    monkeypatch.setattr(eagle_train, "PAD_TO_MULTIPLE", 1)
    tight = eagle_train.collate(rows)
    assert tight["input_ids"].shape[1] == 11
    (loss, grads), (tight_loss, tight_grads) = loss_and_grads(padded), loss_and_grads(tight)
    assert torch.allclose(loss, tight_loss, atol=1e-6)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, tight_grads))


def test_chain_acceptance_counts_runs_of_matches():
    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0)
    draft = Eagle3Draft(Eagle3Config.for_target(target.config, draft_vocab_size=target.config.vocab_size))
    # Hand-built logits: 2 steps over n=4 slots; the reference says token 7 everywhere.
    ref = torch.full((1, 5), 7)
    step0 = torch.zeros(1, 4, target.config.vocab_size)
    step0[0, :, 7] = 1.0  # every step-0 guess right
    step1 = torch.zeros(1, 4, target.config.vocab_size)
    step1[0, :2, 7] = 1.0  # step-1 guesses right for the first two chains only
    step1[0, 2:, 3] = 1.0
    accepted, counted = chain_acceptance([step0, step1], ref, draft, torch.ones(1, 5, dtype=torch.bool))
    assert counted == 3  # chains whose 2 steps both have a reference
    assert accepted == [3, 2]
    assert implied_mal(accepted, counted) == pytest.approx(1 + 5 / 3)


def test_served_walk_anchors_where_the_last_step_left_off():
    """Serving's walk over hand-built chains: a chain starts a + 1 slots after the last one, k is cut to
    the tokens left less one, and the last token is a plain step."""
    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0)
    vocab = target.config.vocab_size
    draft = Eagle3Draft(Eagle3Config.for_target(target.config, draft_vocab_size=vocab))
    ids = torch.tensor([[10, 11, 12, 13, 14, 15, 16, 17]] * 2)  # prompt 10 11 12, answer 13..17 (P=3, T=8)
    ref = torch.cat([ids[:, 1:], torch.zeros(2, 1, dtype=torch.long)], 1)  # ref[p]: the token at p+1
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[:, 2:7] = True  # the answer's positions P-1 .. T-2, as collate marks them without prompt_loss
    steps = [torch.zeros(2, 7, vocab) for _ in range(2)]
    for logits in steps:
        logits[..., 3] = 1.0  # wrong everywhere unless set below
    # Row 0: the chain at slot 2 (the last prompt position's slot) is right twice -> 3 tokens; 1 token is
    # left, so the next step is a plain one. 2 steps, 4 tokens.
    steps[0][0, 2, 14], steps[1][0, 2, 15] = 2.0, 2.0
    # Row 1: slot 2 misses (1 token); slot 3 is right once (2 tokens); one token left: a plain step.
    steps[0][1, 3, 15] = 2.0
    steps[1][1, 3, 16] = 0.0  # and its second guess stays wrong
    # Slot 4, which serving never anchors in row 0 nor row 1, is right: it counts for the implied figure only.
    steps[0][:, 4, 16] = 2.0
    assert served_walk(steps, ref, draft, mask) == (4 + 4, 2 + 3)
    assert served_walk(steps, ref[:1], draft, mask[:1]) == (4, 2)
    # Serving's chain cut: at 0.999 every chain stops after its first token (no guess is that sure), so
    # row 0's right pair of guesses gives 2 tokens, then slot 4 (made wrong here) 1, then a plain step.
    steps[0][0, 4, 16] = 0.0
    assert served_walk(steps, ref[:1], draft, mask[:1]) == (4, 2)  # slot 4 is never anchored without a cut
    assert served_walk(steps, ref[:1], draft, mask[:1], min_path_prob=0.999) == (4, 3)
    assert served_walk(steps, ref[:1], draft, mask[:1], min_path_prob=1e-9) == (4, 2)  # a cut never reached


def test_vocab_from_counts_keeps_most_frequent_and_always():
    counts = torch.tensor([5, 0, 9, 1, 0, 7])
    d2t, t2d = vocab_from_counts(counts, 3, always=[4])
    chosen = (torch.arange(3) + d2t).tolist()
    assert chosen == [2, 4, 5]  # ascending target ids: 9 and 7 most frequent, 4 forced
    assert t2d.tolist() == [False, False, True, False, True, True]


def test_the_verifier_recorded_is_the_targets_hub_id_or_none(tmp_path):
    """What a trained draft records as its verifier: the target's Hugging Face id where known (the reference
    dir bootstrap trains on, a hub id), else none (`draftwheel export --verifier` names it); never a path."""
    from types import SimpleNamespace

    from draftwheel.serving.engine.reference import HUB_ID, REFERENCE_DIR_NAME
    from draftwheel.training.eagle_train import verifier_id

    reference = SimpleNamespace(path=tmp_path / "models" / REFERENCE_DIR_NAME)
    assert verifier_id(EagleConfig(target=""), reference) == HUB_ID
    assert verifier_id(EagleConfig(target=str(reference.path)), reference) == HUB_ID
    snapshot = SimpleNamespace(path=tmp_path / "hub" / "models--org--name" / "snapshots" / "0a1b")
    assert verifier_id(EagleConfig(target="org/name"), snapshot) == "org/name"
    assert verifier_id(EagleConfig(target=str(tmp_path)), SimpleNamespace(path=tmp_path)) == ""


@pytest.fixture(scope="module")
def trained(tmp_path_factory, toy_models, toy_data):
    out = tmp_path_factory.mktemp("eagle") / "candidate"
    config = EagleConfig(student="", target=str(toy_models["target"]), dataset=str(toy_data["distill"]),
                         output_dir=str(out), draft_vocab_size=128, epochs=60, batch_size=4, learning_rate=1e-2,
                         ttt_steps=3, eval_k=3, tracking=False, max_length=64, warmup_steps=0,
                         feature_cache=str(out.parent / "cache"), probe_canary=False, early_stop_patience=0,
                         weight_mixes=[0.5])
    return train_eagle(config), config


def test_train_eagle_improves_and_saves_speculators_dir(trained):
    out, _ = trained
    info = json.loads((out / "draftwheel_training.json").read_text())
    history = info["eval_history"]
    assert history[0]["epoch"] == 0.0 and len(history) >= 2
    best = max(h["implied_mal"] for h in history)
    assert best > history[0]["implied_mal"] + 0.2, history
    assert {"slice.code.implied_mal", "slice.chat.implied_mal"} <= set(history[0])  # judged per slice
    assert {"served_mal", "slice.code.served_mal", "slice.chat.served_mal"} <= set(history[0])
    assert all(1.0 <= h["served_mal"] <= 1.0 + 3 for h in history)  # eval_k = 3 drafts and a bonus per step
    selection = info["epoch_selection"]
    assert selection["metric"] == "implied_mal"  # the default (select_on)
    assert selection["selected_epoch"] > 0  # a trained epoch, and the saved weights (history[-1]) improved
    assert history[-1]["implied_mal"] > history[0]["implied_mal"] + 0.2
    assert len(selection["scores"]) >= 2 and all("worst_group" in score for score in selection["scores"])
    assert not any("mix" in h for h in history)  # a fresh draft: no start to mix with
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["draft_vocab_size"] == 128
    assert config["speculators_config"]["verifier"]["name_or_path"] == ""  # a local target: no known hub id
    assert info["metrics"]["feature_cache_hit"] == 0.0
    # the chain cut's confidence, calibrated on the probe and saved with the draft
    from draftwheel.training.confidence import GRID
    metrics = info["metrics"]
    assert config["draftwheel"]["confidence_temperature"] == metrics["calibration_confidence_temperature"] in GRID
    assert metrics["calibration_positions"] > 0 and 0.0 <= metrics["calibration_agreement"] <= 1.0
    assert metrics["calibration_nll_after"] <= metrics["calibration_nll_before"]


def test_epoch_selection_can_compare_the_served_walk(trained, tmp_path):
    """`select_on: served_mal` judges each epoch by serving's walk: the kept epoch is the best of those
    scores, and the scores are the served figures' changes, not the implied ones'."""
    from dataclasses import replace

    from draftwheel.training.evaluate import best_evaluation

    _, config = trained
    out = train_eagle(replace(config, epochs=6, select_on="served_mal", output_dir=str(tmp_path / "served")))
    info = json.loads((out / "draftwheel_training.json").read_text())
    selection, history = info["epoch_selection"], info["eval_history"]
    assert selection["metric"] == "served_mal"
    scores = selection["scores"]
    assert scores[best_evaluation(scores)]["epoch"] == selection["selected_epoch"] == history[-1]["epoch"]
    start, best = history[0], scores[best_evaluation(scores)]
    kept = next(h for h in history if h["epoch"] == best["epoch"])
    assert best["overall_change"] == pytest.approx(kept["served_mal"] / start["served_mal"] - 1, abs=1e-9)


def test_bf16_training_runs_the_unrolled_draft_under_autocast(trained, tmp_path, monkeypatch):
    """`bf16: true` must reach the draft's matmuls: accelerate's autocast wraps only `model.forward`,
    which the unrolled loop does not call (this trained in float32 before, 4-5x slower on AMX)."""
    out, config = trained
    seen = []

    def recording_unroll(*args, **kwargs):
        logits = unroll(*args, **kwargs)
        if torch.is_grad_enabled():  # a training step (the per-epoch probe runs without gradients)
            seen.append((torch.is_autocast_enabled("cpu"), logits[0].dtype))
        return logits

    unroll = eagle_ttt.unroll
    monkeypatch.setattr(eagle_ttt, "unroll", recording_unroll)
    for bf16, expected in ((True, (True, torch.bfloat16)), (False, (False, torch.float32))):
        seen.clear()
        train_eagle(EagleConfig(**{**vars(config), "output_dir": str(tmp_path / f"bf16-{bf16}"), "bf16": bf16,
                                   "max_steps": 1, "keep_best_epoch": False}))
        assert seen == [expected]  # max_steps 1: one training step


def test_feature_cache_reused_on_second_run(trained, tmp_path):
    out, config = trained
    again = train_eagle(EagleConfig(**{**vars(config), "output_dir": str(tmp_path / "again"), "epochs": 1.0}))
    info = json.loads((again / "draftwheel_training.json").read_text())
    assert info["metrics"]["feature_cache_hit"] == 1.0


def test_prompt_variants_join_the_training_data_answered_by_the_target(trained, toy_models, tmp_path):
    """prompt_variants: each multi-line mined prompt cut 1..N lines short joins the data, answered by the
    continuation step; the rehearsal sample stays sized by the mined requests."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from draftwheel.training.prompt_variants import variant_prompts
    from draftwheel.training.target_completions import save_rows, target_traffic

    out, config = trained
    tokenizer = AutoTokenizer.from_pretrained(toy_models["target"])
    target = AutoModelForCausalLM.from_pretrained(toy_models["target"]).eval()
    workload = [{"prompt": f"Fix:\n\nx{i} = {i}\ny{i} = 2\nz{i} = 3\nw{i} = 4", "slice": "code"} for i in range(3)] + \
               [{"prompt": "Say hi", "slice": "chat"}]
    rows = target_traffic(target, tokenizer, workload, max_new_tokens=6, batch_size=4, progress=False)
    mined = save_rows(rows, tmp_path / "mined")
    expected, _ = variant_prompts([r["prompt_token_ids"] for r in rows], [r["slice"] for r in rows], tokenizer, 2, 62)
    assert len(expected) == 6  # two per 6-line request, none for the one-line one
    base = {**vars(config), "dataset": str(mined), "epochs": 1.0, "continue_to": 8, "student": str(out),
            "rehearsal_ratio": 0.5, "keep_best_epoch": False}
    with_variants = train_eagle(EagleConfig(**{**base, "prompt_variants": 2, "output_dir": str(tmp_path / "v")}))
    plain = train_eagle(EagleConfig(**{**base, "output_dir": str(tmp_path / "p")}))
    metrics = json.loads((with_variants / "draftwheel_training.json").read_text())["metrics"]
    plain_metrics = json.loads((plain / "draftwheel_training.json").read_text())["metrics"]
    assert metrics["variant_sequences"] == 6
    assert metrics["continued_sequences"] >= 6  # the variants were answered by the target
    assert metrics["continued_tokens"] >= plain_metrics["continued_tokens"] + 6
    assert metrics["train_tokens"] > plain_metrics["train_tokens"]
    assert metrics["rehearsal_sequences"] == plain_metrics["rehearsal_sequences"] == round(0.5 * 4)
    renamed = train_eagle(EagleConfig(**{**base, "prompt_variants": 2, "prompt_renames": 1,
                                         "output_dir": str(tmp_path / "r")}))
    renamed_metrics = json.loads((renamed / "draftwheel_training.json").read_text())["metrics"]
    assert renamed_metrics["variant_sequences"] == 9  # and one renamed request per code request
    assert renamed_metrics["continued_tokens"] > metrics["continued_tokens"]
    with pytest.raises(ValueError, match="prompt_renames"):
        EagleConfig(prompt_renames=1, continue_to=0)
    with pytest.raises(ValueError, match="prompt_variants"):
        EagleConfig(prompt_variants=2, continue_to=0)
    with pytest.raises(ValueError, match="prompt_variants"):
        EagleConfig(prompt_variants=-1)


def _state_with_a_trained_draft(state: Path, monkeypatch) -> Path:
    """A state dir holding a dataset and a draft dir whose training info says it learned from it."""
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(state))
    (state / "datasets" / "bootstrap" / "distill").mkdir(parents=True)
    draft = state / "models" / "v0"
    common.write_training_info(draft, "eagle", EagleConfig(max_length=96), {},
                               {"dataset": str(state / "datasets" / "bootstrap" / "distill")})
    return draft


def test_rehearsal_follows_a_moved_state_dir(tmp_path, monkeypatch):
    """The warm start's data is found under the state dir it now lives in, not the path it was written at."""
    _state_with_a_trained_draft(tmp_path / "old", monkeypatch)
    (tmp_path / "old").rename(tmp_path / "new")
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "new"))
    source = rehearsal_source(EagleConfig(), str(tmp_path / "new" / "models" / "v0"))
    assert source == (tmp_path / "new" / "datasets" / "bootstrap" / "distill", 96)


def test_a_copied_state_dir_rehearses_its_own_data(tmp_path, monkeypatch):
    import shutil

    _state_with_a_trained_draft(tmp_path / "a", monkeypatch)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "b"))
    source = rehearsal_source(EagleConfig(), str(tmp_path / "b" / "models" / "v0"))
    assert source[0] == tmp_path / "b" / "datasets" / "bootstrap" / "distill"


def test_missing_rehearsal_data_is_reported_not_silent(tmp_path, monkeypatch, capsys):
    draft = _state_with_a_trained_draft(tmp_path / "s", monkeypatch)
    (tmp_path / "s" / "datasets" / "bootstrap" / "distill").rmdir()
    assert rehearsal_source(EagleConfig(), str(draft)) is None
    out = capsys.readouterr().out
    assert "WARNING" in out and "training without rehearsal" in out
    assert str(tmp_path / "s" / "datasets" / "bootstrap" / "distill") in out
    assert rehearsal_source(EagleConfig(rehearsal=""), str(draft)) is None  # switched off: nothing to say
    assert capsys.readouterr().out == ""


def test_warm_start_rehearses_the_data_it_learned_from(trained, toy_data, tmp_path):
    """rehearsal: auto follows the warm start's training info back to its data (features from the cache),
    and a draft trained from that one still rehearses the original data, not the round's mined data."""
    import shutil

    out, config = trained
    mined = tmp_path / "mined"
    shutil.copytree(toy_data["distill"], mined)  # another round's data (a copy: same sequences, new dir)
    base = {**vars(config), "dataset": str(mined), "epochs": 1.0, "rehearsal_ratio": 0.5}
    first = train_eagle(EagleConfig(**{**base, "student": str(out), "output_dir": str(tmp_path / "r1")}))
    info = json.loads((first / "draftwheel_training.json").read_text())
    n_mined = len(load_sequences(mined, config.max_length).ids)
    assert info["rehearsal"] == str(toy_data["distill"])
    assert info["metrics"]["rehearsal_sequences"] == round(0.5 * n_mined) > 0
    assert info["metrics"]["rehearsal_cache_hit"] == 1.0  # the warm start's own run cached them
    # A warm start: the half step toward the trained weights was judged, and the saved weights are one of the two.
    assert [h["mix"] for h in info["eval_history"] if "mix" in h][:1] == [0.5]
    assert info["eval_history"][-1]["mix"] in (0.5, 1.0)
    second = train_eagle(EagleConfig(**{**base, "student": str(first), "output_dir": str(tmp_path / "r2")}))
    assert json.loads((second / "draftwheel_training.json").read_text())["rehearsal"] == str(toy_data["distill"])
    off = train_eagle(EagleConfig(**{**base, "student": str(out), "rehearsal": "", "output_dir": str(tmp_path / "r3")}))
    off_info = json.loads((off / "draftwheel_training.json").read_text())
    assert "rehearsal" not in off_info
    twice = train_eagle(EagleConfig(**{**base, "student": str(out), "rehearsal": "", "mined_passes": 2,
                                       "output_dir": str(tmp_path / "r4")}))
    twice_info = json.loads((twice / "draftwheel_training.json").read_text())
    assert twice_info["metrics"]["train_tokens"] == 2 * off_info["metrics"]["train_tokens"]  # each mined row twice
    assert twice_info["metrics"]["steps"] > off_info["metrics"]["steps"]
    with pytest.raises(ValueError, match="rehearsal_ratio"):
        EagleConfig(rehearsal_ratio=-1.0)
    with pytest.raises(ValueError, match="mined_passes"):
        EagleConfig(mined_passes=0)
    with pytest.raises(ValueError, match="max_mined_per_epoch"):
        EagleConfig(max_mined_per_epoch=-1)
    with pytest.raises(ValueError, match="ttt_chain_share"):
        EagleConfig(ttt_chain_share=0.0)
    with pytest.raises(ValueError, match="select_on"):
        EagleConfig(select_on="loss")
    with pytest.raises(ValueError, match="teacher_temperature"):
        EagleConfig(teacher_temperature=0.0)


def test_lengthen_continues_cut_outputs_with_the_targets_greedy_tokens(toy_models, toy_data, tmp_path):
    """Outputs cut by their request's max_new_tokens (12 in toy_data) grow to `continue_to` output tokens
    (or an EOS) with exactly the target's greedy continuation, and generation's hidden states come back as
    those sequences' features: the same as a teacher-forced forward over the grown sequence would give.
    The cache is per sequence: a second call reads every one (and then has no hidden states to give), a
    set with one sequence changed generates that one alone."""
    from draftwheel.serving.engine.engine import eos_token_ids
    from tests.serving.test_engine import hf_greedy
    from draftwheel.training.eagle_features import compute_features
    from draftwheel.training.eagle_train import lengthen

    target = load_model(toy_models["target"])
    eos = eos_token_ids(target)
    config = EagleConfig(continue_to=20, max_length=64, bf16=False)  # float32: comparable with hf_greedy
    aux = [0, 1, 1]
    seqs = load_sequences(toy_data["distill"], config.max_length)
    before = [list(ids) for ids in seqs.ids]
    info, rows = lengthen(seqs, target, eos, config, tmp_path, aux)
    cut = [i for i, ids in enumerate(before) if ids[-1] not in eos]
    assert info["continued_sequences"] == len(cut) > 1 and info["continuations_cached"] == 0
    for i in cut:
        p = seqs.prompt_lens[i]
        grown = seqs.ids[i]
        assert grown[: len(before[i])] == before[i]
        assert len(grown) - p == 20 or grown[-1] in eos
        assert grown[p:] == hf_greedy(target.model, grown[:p], len(grown) - p)  # the target's own tokens
    assert all(seqs.ids[i] == before[i] for i in range(len(before)) if i not in cut)

    assert set(rows) == set(cut) and info["features_from_generation"] == len(cut)
    forward = compute_features(target.model, seqs.ids, aux, progress=False)
    for i in cut:
        (aux_gen, hidden_gen, argmax_gen), (aux_fwd, hidden_fwd, argmax_fwd) = rows[i], forward.sequence(i)
        assert aux_gen.shape == aux_fwd.shape == (len(seqs.ids[i]), 3 * target.model.config.hidden_size)
        torch.testing.assert_close(aux_gen.float(), aux_fwd.float(), atol=2e-3, rtol=2e-3)
        torch.testing.assert_close(hidden_gen.float(), hidden_fwd.float(), atol=2e-3, rtol=2e-3)
        assert torch.equal(argmax_gen, argmax_fwd)
    merged = compute_features(target.model, seqs.ids, aux, progress=False, known=rows)
    torch.testing.assert_close(merged.aux.float(), forward.aux.float(), atol=2e-3, rtol=2e-3)
    assert torch.equal(merged.offsets, forward.offsets)

    again = load_sequences(toy_data["distill"], config.max_length)
    info, rows = lengthen(again, target, eos, config, tmp_path, aux)
    assert info["continuations_cached"] == len(cut) and rows == {}
    assert again.ids == seqs.ids
    changed = load_sequences(toy_data["distill"], config.max_length)
    first = cut[0]
    head = (changed.ids[first][0] + 1) % target.model.config.vocab_size
    changed.ids[first] = logged = [head, *changed.ids[first][1:]]  # a new sequence: its first token differs
    info, rows = lengthen(changed, target, eos, config, tmp_path, aux)
    assert info["continuations_cached"] == len(cut) - 1 and set(rows) == {first}
    grown = changed.ids[first]
    assert grown[len(logged):] == hf_greedy(target.model, logged, len(grown) - len(logged)) != []
    assert all(changed.ids[i] == seqs.ids[i] for i in cut[1:])
    alone = load_sequences(toy_data["distill"], config.max_length)  # continuations only: no states kept
    info, rows = lengthen(alone, target, eos, config, tmp_path / "alone", None)
    assert info["continuations_cached"] == 0 and rows == {} and alone.ids == seqs.ids
    with pytest.raises(ValueError, match="continue_to"):
        EagleConfig(continue_to=-1)


def test_features_are_cached_per_sequence_so_a_set_sharing_sequences_runs_only_the_new_ones(toy_models, toy_data,
                                                                                            tmp_path, monkeypatch):
    """A later round's set holds earlier rounds' sequences: their rows are read back, the target runs over
    the new sequences alone, and the features equal a fresh computation of the whole set."""
    from draftwheel.training import eagle_features
    from draftwheel.training.eagle_features import cached_features, compute_features

    target = load_model(toy_models["target"])
    aux, sha = [0, 1, 1], target.model_id.sha256
    seqs = load_sequences(toy_data["distill"], 64).ids
    first, rest = seqs[: len(seqs) // 2], seqs[len(seqs) // 2:]
    assert first and rest
    _, share = cached_features(target.model, first, aux, sha, tmp_path, progress=False)
    assert share == 0.0
    fed: list[list[int]] = []
    real_forward = eagle_features._forward
    monkeypatch.setattr(eagle_features, "_forward",
                        lambda model, batch, *args: (fed.extend(batch), real_forward(model, batch, *args))[1])
    features, share = cached_features(target.model, seqs, aux, sha, tmp_path, progress=False)
    assert sorted(fed) == sorted(rest) and share == len(first) / len(seqs)
    whole = compute_features(target.model, seqs, aux, progress=False)
    torch.testing.assert_close(features.aux.float(), whole.aux.float(), atol=2e-3, rtol=2e-3)
    assert torch.equal(features.argmax, whole.argmax) and torch.equal(features.offsets, whole.offsets)
    fed.clear()
    assert cached_features(target.model, seqs, aux, sha, tmp_path, progress=False)[1] == 1.0 and fed == []
    assert cached_features(target.model, seqs, [0, 0, 1], sha, tmp_path, progress=False)[1] == 0.0  # other layers


def test_feature_rows_take_the_argmax_generation_chose_and_score_only_the_rest():
    """row_from_states runs the head only where generation chose no token: before `chosen_from` and
    after the chosen run (an EOS's position: nothing is chosen after it). The tokens it is given stand
    at their positions, and every other position gets the head's argmax."""
    from draftwheel.training.eagle_features import row_from_states

    model = tiny_llama(build_tokenizer(), n_layers=1, seed=0)
    states = tuple(torch.randn(10, model.config.hidden_size) for _ in range(2))
    with torch.inference_mode():
        full = model.get_output_embeddings()(states[-1]).argmax(-1)
    aux, hidden, argmax = row_from_states(model, states, 9, [0])
    assert torch.equal(argmax, full[:9]) and aux.shape == hidden.shape == (9, model.config.hidden_size)
    picked = [7, 8, 9]  # not the head's argmax: it shows which positions were taken from `chosen`
    assert full[4:7].tolist() != picked
    _, _, argmax = row_from_states(model, states, 9, [0], chosen=picked, chosen_from=4)
    assert argmax.tolist() == full[:4].tolist() + picked + full[7:9].tolist()
    _, _, argmax = row_from_states(model, states, 9, [0], chosen=picked + [1, 2, 3], chosen_from=4)
    assert argmax.tolist() == full[:4].tolist() + (picked + [1, 2])  # run past n: cut at n


def test_generation_runs_a_prepacked_copy_that_decodes_the_same_greedy_tokens():
    """Continuations and canary answers are generated by a copy of the target with its linear layers
    prepacked for oneDNN (as the Engine serves it); the target itself stays stock, and the greedy tokens
    are the stock model's. Hidden 384 puts the layers above prepack's size threshold."""
    from types import SimpleNamespace

    from draftwheel.serving.engine.prepack import can_prepack, is_packed
    from draftwheel.training.eagle_train import generation_model
    from draftwheel.training.target_completions import greedy_continuations

    tokenizer = build_tokenizer()
    model = tiny_llama(tokenizer, n_layers=1, hidden=384)
    packed = generation_model(SimpleNamespace(model=model), bf16=False)
    assert is_packed(packed) == can_prepack(model) and not is_packed(model)
    generator = torch.Generator().manual_seed(0)
    sequences = [torch.randint(10, len(tokenizer), (n,), generator=generator).tolist() for n in (5, 9, 14)]
    stock = greedy_continuations(model, tokenizer, sequences, 16, batch_size=2, progress=False)
    assert greedy_continuations(packed, tokenizer, sequences, 16, batch_size=2, progress=False) == stock
    assert all(stock)


def test_generation_uses_the_target_itself_when_there_is_nothing_to_pack(monkeypatch):
    """A target oneDNN cannot pack (a GPU model, say) in float32 is generated with as it is: no copy."""
    from types import SimpleNamespace

    import draftwheel.training.eagle_train as eagle_train

    model = tiny_llama(build_tokenizer(), n_layers=1)
    monkeypatch.setattr(eagle_train, "can_prepack", lambda m: False)
    assert eagle_train.generation_model(SimpleNamespace(model=model), bf16=False) is model
    copied = eagle_train.generation_model(SimpleNamespace(model=model), bf16=True)
    assert copied is not model and next(copied.parameters()).dtype == torch.bfloat16


def test_lengthen_leaves_a_sequence_whose_last_token_was_never_fed_to_the_forward(toy_models, toy_data, tmp_path,
                                                                                   monkeypatch):
    """When generation stopped before feeding a kept token (every row ended with an EOS at the last
    step), that sequence gets no features from generation; the feature forward computes it instead."""
    import draftwheel.training.target_completions as completions
    from draftwheel.serving.engine.engine import eos_token_ids
    from draftwheel.training.eagle_train import lengthen

    generate = completions.greedy_continuations

    def stopped_early(*args, on_states=None, **kwargs):
        # lengthen generates one token past the budget; without the last two fed positions, the last kept
        # token of every toy sequence was never fed
        trim = None if on_states is None else lambda i, more, fed: on_states(i, more, tuple(s[:-2] for s in fed))
        return generate(*args, on_states=trim, **kwargs)

    monkeypatch.setattr(completions, "greedy_continuations", stopped_early)
    target = load_model(toy_models["target"])
    config = EagleConfig(continue_to=20, max_length=64, bf16=False)
    seqs = load_sequences(toy_data["distill"], config.max_length)
    info, rows = lengthen(seqs, target, eos_token_ids(target), config, tmp_path, [0, 1, 1])
    assert info["continued_sequences"] > 0 and info["features_from_generation"] == 0 and rows == {}


def test_probe_features_cache_the_standing_part_apart_from_the_rounds_holdout(toy_models, toy_data, tmp_path,
                                                                            monkeypatch):
    """The probe's features are cached per sequence: a later round with a new hold-out runs the target
    over the hold-out only, and the joined features are the ones a single pass would give."""
    import draftwheel.training.eagle_features as eagle_features
    from draftwheel.training.eagle_features import compute_features
    from draftwheel.training.eagle_train import Sequences, probe_with_features

    target = load_model(toy_models["target"])
    seqs = load_sequences(toy_data["distill"], 64)
    standing = Sequences(seqs.ids[:3], seqs.prompt_lens[:3], seqs.slices[:3])
    round_1 = Sequences(seqs.ids[3:5], seqs.prompt_lens[3:5], seqs.slices[3:5])
    round_2 = Sequences(seqs.ids[5:7], seqs.prompt_lens[5:7], seqs.slices[5:7])
    fed: list[list[int]] = []  # the sequences the target ran over
    forward = eagle_features._forward
    monkeypatch.setattr(eagle_features, "_forward",
                        lambda model, batch, *a: (fed.extend(batch), forward(model, batch, *a))[1])
    aux = [0, 1, 1]
    probe, features = probe_with_features([round_1, standing], target, aux, tmp_path, bf16=False)
    assert probe.ids == round_1.ids + standing.ids and probe.slices == round_1.slices + standing.slices
    assert sorted(fed) == sorted(round_1.ids + standing.ids)
    single = compute_features(target.model, probe.ids, aux, progress=False)
    assert torch.equal(features.offsets, single.offsets) and torch.equal(features.argmax, single.argmax)
    torch.testing.assert_close(features.aux.float(), single.aux.float(), atol=2e-3, rtol=2e-3)
    torch.testing.assert_close(features.hidden.float(), single.hidden.float(), atol=2e-3, rtol=2e-3)
    fed.clear()
    probe, features = probe_with_features([round_2, standing], target, aux, tmp_path, bf16=False)
    assert sorted(fed) == sorted(round_2.ids)  # the standing part came from its cache
    assert [len(features.sequence(i)[2]) for i in range(len(probe.ids))] == [len(ids) for ids in probe.ids]


def test_canary_probe_is_the_targets_greedy_answers_cached(toy_models, tmp_path):
    """The forgetting probe's canary part: every canary prompt (all gated slices) with the target's greedy
    answer, generated once and read from the cache after."""
    from draftwheel.evaluation.shadow import DEFAULT_CANARY, load_canary
    from tests.serving.test_engine import hf_greedy
    from draftwheel.training.eagle_train import canary_sequences

    target = load_model(toy_models["target"])
    config = EagleConfig(max_length=128, bf16=False)  # float32: comparable with hf_greedy
    seqs = canary_sequences(target, config, tmp_path)
    canary = load_canary(DEFAULT_CANARY)
    assert seqs.slices == [c.slice for c in canary] and {"code", "chat", "prose"} <= set(seqs.slices)
    for ids, p, request in zip(seqs.ids, seqs.prompt_lens, canary):
        assert 0 < len(ids) - p <= request.max_new_tokens
        assert ids[p:] == hf_greedy(target.model, ids[:p], len(ids) - p)
    assert len(list((tmp_path / "canary").glob("*.json"))) == 1
    assert canary_sequences(target, config, tmp_path).ids == seqs.ids  # from the cache


def test_trained_draft_serves_losslessly(trained, toy_models):
    out, _ = trained
    target = load_model(toy_models["target"])
    engine = Engine(target, load_model(out))
    prompts = ["def add(a, b):", "The quick brown fox", "Hello! How can I help"]
    # Chat-templated, as the training traffic was (draftwheel.training.target_completions applies the template).
    completions = engine.generate(prompts, SamplingParams(max_new_tokens=24, k=3), chat=True)
    reference = Engine(load_model(toy_models["target"])).generate(prompts, SamplingParams(max_new_tokens=24),
                                                                  mode="autoregressive", chat=True)
    assert [c.token_ids for c in completions] == [r.token_ids for r in reference]
    assert sum(c.record.accepted_tokens for c in completions) > 0


def test_served_walk_gives_the_engines_own_figures(trained, toy_models):
    """The probe's `served_mal` is what the engine measures: greedy serving with the trained draft (full
    chains of k) emits, request by request, the tokens and verification steps that the walk over the
    teacher-forced chains of the same answer gives."""
    from draftwheel.training.eagle_train import answer_chains

    out, _ = trained
    target = load_model(toy_models["target"])
    loaded = load_model(out)
    prompts = ["def add(a, b):", "The quick brown fox", "Hello! How can I help", "Write a poem"]
    completions = Engine(target, loaded).generate(prompts, SamplingParams(max_new_tokens=24, k=3), chat=True)
    walked = []
    for c in completions:
        logits, reference, mask = answer_chains(target.model, loaded.model, c.prompt_token_ids, c.token_ids, 3)
        walked.append(served_walk(logits, reference, loaded.model, mask))
    # Tokens after the prefill's first one, and steps, as the engine counted them.
    served = [(c.record.accepted_tokens + c.record.verify_steps, c.record.verify_steps) for c in completions]
    assert sum(tokens for tokens, _ in served) > sum(steps for _, steps in served)  # some drafts accepted
    assert walked == served


def test_revocab_keeps_shared_rows_and_starts_new_ones_from_the_target_head():
    from draftwheel.training.eagle_train import coverage, revocab

    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    vocab = target.config.vocab_size
    old_counts = torch.zeros(vocab)
    old_counts[:8] = 1.0  # the old traffic used ids 0..7
    d2t, t2d = vocab_from_counts(old_counts, 8)
    draft = Eagle3Draft(Eagle3Config.for_target(target.config, draft_vocab_size=8), d2t=d2t, t2d=t2d)
    new_counts = torch.zeros(vocab)
    new_counts[4:12] = 5.0  # traffic moved to ids 4..11: the old vocabulary covers half of it
    assert coverage(draft.t2d, new_counts) == pytest.approx(0.5)
    new = revocab(draft, new_counts, 8, target, eos=[])
    assert new.draft_to_target.tolist() == list(range(4, 12)) and coverage(new.t2d, new_counts) == 1.0
    assert torch.equal(new.lm_head.weight[0], draft.lm_head.weight[4])  # id 4: row carried over
    assert torch.equal(new.lm_head.weight[7], target.lm_head.weight[11])  # id 11: the target's row
    assert torch.equal(new.fc.weight, draft.fc.weight)  # everything but the head carries over
    wider = revocab(draft, new_counts, 12, target, eos=[])  # room left: the old ids 0..3 fill it, no unseen id
    assert wider.draft_to_target.tolist() == list(range(12))
    sparse = torch.zeros(vocab)
    sparse[[20, 21]] = 1.0  # a round that saw two new ids: they rank first, the old ones fill the rest
    chosen = set(revocab(draft, sparse, 8, target, eos=[]).draft_to_target.tolist())
    assert {20, 21} <= chosen and chosen - {20, 21} <= set(range(8))


def test_a_rebuilt_vocabulary_ranks_the_warm_starts_data_too():
    """When the mined outputs leave rows free, a rebuilt vocabulary fills them with the tokens the warm
    start's own data used most (`rank_counts`), not with arbitrary rows of the old vocabulary; whether to
    rebuild at all is still judged on the mined outputs alone."""
    from types import SimpleNamespace

    from draftwheel.training.eagle_train import prepare_draft

    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    loaded = SimpleNamespace(model=target, model_id=SimpleNamespace(sha256="target"))
    vocab = target.config.vocab_size

    def warm_draft() -> Eagle3Draft:
        old = torch.zeros(vocab)
        old[:8] = 1.0  # the warm start's vocabulary: ids 0..7
        d2t, t2d = vocab_from_counts(old, 8)
        return Eagle3Draft(Eagle3Config.for_target(target.config, draft_vocab_size=8), d2t=d2t, t2d=t2d)

    mined, rehearsal = torch.zeros(vocab), torch.zeros(vocab)
    mined[[20, 21]] = 3.0  # the round's traffic: two ids the warm start cannot propose
    rehearsal[[5, 6, 7]] = 9.0  # the old traffic used 5..7 most, then 0
    rehearsal[0] = 1.0
    config = EagleConfig(draft_vocab_size=6, min_vocab_coverage=0.97)
    draft, info = prepare_draft(config, loaded, mined, [], warm_draft(), mined + rehearsal)
    assert info["vocab"] == "rebuilt" and info["warm_vocab_coverage"] == 0.0 and info["vocab_coverage_train"] == 1.0
    assert draft.draft_to_target.tolist() == [0, 5, 6, 7, 20, 21]
    old_only = torch.zeros(vocab)
    old_only[[1, 2]] = 1.0  # mined outputs the warm vocabulary covers: kept, whatever rank_counts says
    kept, info = prepare_draft(config, loaded, old_only, [], warm_draft(), old_only + mined)
    assert info["vocab"] == "kept" and kept.draft_to_target.tolist() == list(range(8))


def test_an_epoch_sees_the_mined_set_passes_times_up_to_the_cap():
    mined = list(range(10))
    uncapped, picked = mined_epoch(mined, passes=4, cap=0, seed=0)
    assert len(uncapped) == 40 and sorted(picked) == sorted(mined * 4)
    assert len(mined_epoch(mined, passes=4, cap=50, seed=0)[0]) == 40  # under the cap: every pass
    capped, picked = mined_epoch(mined, passes=4, cap=32, seed=0)
    assert len(capped) == 32 and [capped[i] for i in range(32)] == picked  # 3 whole passes, then 2 of the 10
    assert picked[:30] == mined * 3 and len(set(picked[30:])) == 2
    assert mined_epoch(mined, passes=4, cap=32, seed=0)[1] == picked  # a fixed sample: every epoch the same
    small, picked = mined_epoch(mined, passes=4, cap=6, seed=1)
    assert len(small) == 6 and len(set(picked)) == 6  # more traffic than the cap: a sample of it, each once


def test_a_capped_epoch_shrinks_the_rehearsal_sample_alike():
    """Rehearsal is `rehearsal_ratio` per mined request while every pass fits under the cap; past it, the
    old data shrinks with the share of the passes an epoch sees, so an epoch stays bounded."""
    config = EagleConfig(rehearsal_ratio=2.0, mined_passes=5, max_mined_per_epoch=320)
    assert rehearsal_count(config, 60, 60, len(mined_epoch(list(range(60)), 5, 320, 0)[1])) == 120  # 300: uncapped
    seen = len(mined_epoch(list(range(128)), 5, 320, 0)[1])
    assert seen == 320 and rehearsal_count(config, 128, 128, seen) == 128  # half the passes: half of 2 x 128
    # Sequences per request (prompt variants) count in the share, not in the per-request ratio.
    assert rehearsal_count(config, 20, 100, 320) == round(2.0 * 20 * 320 / 500)


def test_ttt_loss_weighs_positions_and_a_zero_weight_is_a_masked_position():
    """Residual weighting: the loss is the weighted mean over the learned positions, so weight 0 at a
    position gives exactly the loss with that position masked out, and a uniform weight changes nothing."""
    torch.manual_seed(1)
    teacher = torch.log_softmax(torch.randn(2, 7, 11), -1)
    logits = [torch.randn(2, 6, 11) for _ in range(3)]
    mask = torch.ones(2, 7, dtype=torch.bool)
    weights = torch.ones(2, 7)
    weights[0, 2:5] = 0.0
    masked = mask.clone()
    masked[0, 2:5] = False
    assert float(ttt_loss(logits, teacher, mask, 0.5, weights=weights)[0]) == pytest.approx(
        float(ttt_loss(logits, teacher, masked, 0.5)[0]), rel=1e-6)
    assert float(ttt_loss(logits, teacher, mask, 0.5, weights=torch.full((2, 7), 0.3))[0]) == pytest.approx(
        float(ttt_loss(logits, teacher, mask, 0.5)[0]), rel=1e-6)
    halved = torch.ones(2, 7)
    halved[1] = 0.5
    assert float(ttt_loss(logits, teacher, mask, 0.5, weights=halved)[0]) != pytest.approx(
        float(ttt_loss(logits, teacher, mask, 0.5)[0]), rel=1e-3)


def test_mined_rows_weigh_each_answer_token_by_its_served_residual(tmp_path):
    """Position t predicts token t + 1, so an answer token's weight sits on the position before it; prompt
    positions and a continuation past the logged answer weigh 1; floor 1.0 (uniform) ignores the column."""
    from datasets import Dataset

    from draftwheel.training.eagle_train import load_sequences

    Dataset.from_list([{"prompt_token_ids": [1, 2, 3], "completion_token_ids": [4, 5, 6, 7], "slice": "code",
                        "served_residual": [1.0, 0.0, 0.0, 1.0]}]).save_to_disk(tmp_path / "distill")
    seqs = load_sequences(tmp_path / "distill", 64, residual_floor=0.2)
    assert seqs.ids == [[1, 2, 3, 4, 5, 6, 7]]
    assert seqs.position_weights(0).tolist() == pytest.approx([1.0, 1.0, 1.0, 0.2, 0.2, 1.0, 1.0])
    seqs.ids[0] = seqs.ids[0] + [8, 9]  # lengthened by a continuation
    assert seqs.position_weights(0).tolist()[-2:] == [1.0, 1.0]
    assert load_sequences(tmp_path / "distill", 64).weights == {}
    other = load_sequences(tmp_path / "distill", 64, residual_floor=0.0)
    seqs.extend(other)
    assert sorted(seqs.weights) == [0, 1] and seqs.position_weights(1).tolist()[3:5] == [0.0, 0.0]


def test_probe_groups_the_round_and_the_canary_as_the_gate_groups_its_replay(toy_models, tmp_path):
    """The warm start's own hold-out is judged under slices of its own, so the canary's 8 chat and 8 prose
    prompts pool as they do in the gate, whose replay holds the round's hold-out and the canary only;
    with it under the same names, 20 chat examples would make chat a group alone and leave prose unjudged."""
    from datasets import Dataset

    from draftwheel.evaluation.gate import POOLED, slice_groups
    from draftwheel.training.eagle_train import EARLIER, Sequences, probe_parts

    target = load_model(toy_models["target"])
    ids = target.tokenizer("Hello there, how are you today?")["input_ids"]
    Dataset.from_list([{"prompt_token_ids": ids, "output_token_ids": ids[:5], "slice": "chat"}] * 20) \
        .save_to_disk(str(tmp_path / "bootstrap" / "holdout"))
    config = EagleConfig(max_length=128, bf16=False)
    round_holdout = Sequences([], [], [])
    for _ in range(12):
        round_holdout.add(ids, ids[:6], "code", config.max_length)
    parts = probe_parts(config, round_holdout, (tmp_path / "bootstrap" / "distill", 128), target, tmp_path / "cache")
    slices = [s for part in parts for s in part.slices]
    assert slices.count(EARLIER + "chat") == 20 and slices.count("code") == 12 + 4
    assert slices.count("chat") == 8 and slices.count("prose") == 8  # the canary's
    counts = {name: slices.count(name) for name in set(slices)}
    assert slice_groups(counts, 10)[POOLED] == ["chat", "prose"]
    merged = {"chat": 28, "code": 16, "prose": 8}  # the warm start's hold-out under its own slice names
    assert POOLED not in slice_groups(merged, 10)  # prose alone is too small to be a group: never judged
