"""Teacher-forced agreement: the implied-length formula, the greedy replay, the per-slice figures, the
epoch selection (on constructed histories) and the per-epoch callback (on tiny models).

Tiny-model cases use two random toy models A and B of the same shape: a model's greedy outputs are
its own argmax, so it agrees with them everywhere (agreement 1, accepted length k + 1), while the
other model agrees with them only by chance (agreement well under 0.5).
"""

from __future__ import annotations

import pytest
import torch

from draftwheel.serving import testing as toy
from draftwheel.training.data import HoldoutExample
from draftwheel.training.evaluate import (SELECTION_METRIC, AgreementCallback, EpochSelection, EpochSelectionCallback,
                                          best_evaluation, best_mix, evaluate_agreement, greedy_replay,
                                          implied_mean_accepted_length, selection_scores, slice_key,
                                          target_references)


def test_implied_mean_accepted_length():
    assert implied_mean_accepted_length(0.0, 4) == 1.0
    assert implied_mean_accepted_length(1.0, 4) == 5.0
    assert implied_mean_accepted_length(0.5, 4) == pytest.approx(1 + 0.5 + 0.25 + 0.125 + 0.0625)
    with pytest.raises(ValueError, match="a must be"):
        implied_mean_accepted_length(1.5, 4)


def test_greedy_replay_by_hand():
    # matches: T T F T T T T T ; k = 3
    # step 1 at 0: accepts 2 (pos 0, 1), rejects pos 2 -> emits 3, next start 3
    # step 2 at 3: accepts 3 (3, 4, 5) -> bonus token at 6, next start 7
    # step 3 at 7: budget 1, accepts 1
    accepted, drafted = greedy_replay([True, True, False, True, True, True, True, True], k=3)
    assert accepted == [2, 3, 1] and drafted == [3, 3, 1]
    assert greedy_replay([], k=3) == ([], [])


def _examples(model, n=3, length=10, slice_name="default", seed=0):
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for _ in range(n):
        prompt = torch.randint(3, model.config.vocab_size, (5,), generator=generator).tolist()
        ids = list(prompt)
        with torch.no_grad():  # plain argmax decoding (generate() would stop or suppress at EOS)
            for _ in range(length):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
        examples.append(HoldoutExample(prompt, ids[5:], slice_name))
    return examples


def test_a_model_agrees_with_its_own_greedy_outputs():
    model = toy.tiny_llama(toy.build_tokenizer(), n_layers=1, seed=0, tie_embeddings=False)
    metrics = evaluate_agreement(model, _examples(model), k=4, progress=False)
    assert metrics["agreement"] == 1.0
    assert metrics["replay_acceptance_rate"] == 1.0
    assert metrics["acceptance_pos1"] == metrics["acceptance_pos4"] == 1.0
    # 10 outputs with k = 4: each step accepts 4 and adds the bonus token: 2 steps, (8 + 2) / 2
    assert metrics["replay_mean_accepted_length"] == pytest.approx(5.0)


def test_a_different_model_agrees_less_and_references_come_from_the_target():
    tokenizer = toy.build_tokenizer()
    target = toy.tiny_llama(tokenizer, n_layers=2, seed=0, tie_embeddings=False)
    draft = toy.tiny_llama(tokenizer, n_layers=1, seed=5, tie_embeddings=False)
    examples = _examples(target)
    refs = target_references(target, examples, progress=False)
    assert refs == [e.output_ids for e in examples]  # greedy outputs are the target's argmax
    metrics = evaluate_agreement(draft, examples, k=4, references=refs, progress=False)
    assert metrics["agreement"] < 0.5
    assert 1.0 <= metrics["replay_mean_accepted_length"] < 2.5
    with pytest.raises(ValueError, match="k must"):
        evaluate_agreement(draft, examples, k=0)


class _RecordingTracker:
    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step=None):
        self.calls.append((metrics, step))


def test_callback_logs_each_epoch_via_the_tracker():
    from transformers import TrainerControl, TrainerState, TrainingArguments

    model = toy.tiny_llama(toy.build_tokenizer(), n_layers=1, seed=0, tie_embeddings=False)
    tracker = _RecordingTracker()
    callback = AgreementCallback(_examples(model, n=1), tracker, k=2)
    state = TrainerState()
    state.epoch, state.global_step = 1.0, 7
    callback.on_epoch_end(TrainingArguments(output_dir="unused", report_to=[]), state, TrainerControl(), model=model)
    (metrics, step), = tracker.calls
    assert step == 7 and metrics["eval_agreement"] == 1.0 and metrics["eval_epoch"] == 1.0
    assert callback.history[0]["agreement"] == 1.0


def _two_models():
    tokenizer = toy.build_tokenizer()
    return (toy.tiny_llama(tokenizer, n_layers=1, seed=0, tie_embeddings=False),
            toy.tiny_llama(tokenizer, n_layers=1, seed=5, tie_embeddings=False))


def test_figures_per_slice():
    a, b = _two_models()
    examples = _examples(a, n=2, slice_name="old") + _examples(b, n=3, slice_name="new/x", seed=1)
    metrics = evaluate_agreement(a, examples, k=4, progress=False)
    assert metrics[slice_key("old", "agreement")] == 1.0
    assert metrics[slice_key("old", "request_mean_accepted_length")] == pytest.approx(5.0)
    assert metrics[slice_key("new/x", "agreement")] < 0.5 and metrics[slice_key("new/x", "examples")] == 3.0
    assert slice_key("new/x", "agreement") == "slice.new_x.agreement"  # MLflow refuses some characters
    # Overall figures pool both slices.
    assert metrics[slice_key("new/x", "agreement")] < metrics["agreement"] < 1.0 and metrics["examples"] == 5.0


def _entry(epoch: float, **slices: float) -> dict:
    """One evaluation: per slice the SELECTION_METRIC, overall = the example-weighted mean (10 each)."""
    entry = {"epoch": epoch, SELECTION_METRIC: sum(slices.values()) / len(slices)}
    entry.update({slice_key(name, SELECTION_METRIC): value for name, value in slices.items()})
    return entry


def test_selection_prefers_the_epoch_best_for_the_gate_not_the_last():
    # Training on `new` keeps raising it (what a falling training loss shows) while `old` forgets:
    # epoch 1: new +25 %, old -2 % (eligible); epoch 2: new +50 %, old -4 % (eligible, larger gain);
    # epoch 3: new +60 %, old -10 % (beyond the 5 % tolerance: not eligible however large the gain).
    history = [_entry(0, new=2.0, old=3.0), _entry(1, new=2.5, old=2.94), _entry(2, new=3.0, old=2.88),
               _entry(3, new=3.2, old=2.7)]
    counts = {"new": 10, "old": 10}
    scores = selection_scores(history, counts, EpochSelection())
    assert [s["eligible"] for s in scores] == [True, True, True, False]
    assert scores[3]["worst_group"] == "old" and scores[3]["worst_change"] == pytest.approx(-0.1)
    assert best_evaluation(scores) == 2
    # With a stricter tolerance only epoch 1 is eligible.
    assert best_evaluation(selection_scores(history, counts, EpochSelection(tolerance=0.03))) == 1
    # If no trained epoch is eligible, the one whose worst group lost least.
    assert best_evaluation(selection_scores(history, counts, EpochSelection(tolerance=0.01))) == 1


def test_selection_pools_small_slices():
    # Two 6-example slices (< 10 each, 12 together) are judged as one pool: b's -20 % is -10 % of the pool
    # (equal sizes and figures), beyond the tolerance; a 3-example slice alone is ignored (no pool of one).
    history = [_entry(0, big=2.0, a=3.0, b=3.0), _entry(1, big=3.0, a=3.0, b=2.4)]
    scores = selection_scores(history, {"big": 12, "a": 6, "b": 6}, EpochSelection())
    assert scores[1]["group_changes"] == {"big": pytest.approx(0.5), "other/pooled": pytest.approx(-0.1)}
    assert not scores[1]["eligible"]
    lone = selection_scores([_entry(0, big=2.0, a=3.0), _entry(1, big=3.0, a=1.0)], {"big": 12, "a": 3},
                            EpochSelection())
    assert lone[1]["eligible"] and list(lone[1]["group_changes"]) == ["big"]


class _Args:
    world_size = 1


def _epoch(callback, model, state, control, weights, epoch):
    model.load_state_dict(weights)
    state.epoch, state.global_step = float(epoch), 10 * epoch
    callback.on_epoch_end(_Args(), state, control, model=model)


def test_callback_does_not_stop_in_the_first_half_of_training():
    """A slice that dips while the learning rate is high may recover: no early stop before half the steps."""
    from transformers import TrainerControl, TrainerState

    a, b = _two_models()
    weights_a = {k: v.clone() for k, v in a.state_dict().items()}
    weights_b = {k: v.clone() for k, v in b.state_dict().items()}
    examples = _examples(a, n=2, slice_name="old") + _examples(b, n=2, slice_name="new", seed=1)
    callback = AgreementCallback(examples, _RecordingTracker(), k=4,
                                 selection=EpochSelection(min_slice_examples=2, patience=2))
    model, state, control = a, TrainerState(max_steps=80), TrainerControl()  # 8 epochs of 10 steps
    state.epoch = 0.0
    callback.on_train_begin(_Args(), state, control, model=model)
    _epoch(callback, model, state, control, weights_a, 1)
    for epoch in (2, 3, 4):  # forgetting `old`: not eligible, but still the first half
        _epoch(callback, model, state, control, weights_b, epoch)
        assert not control.should_training_stop
    _epoch(callback, model, state, control, weights_b, 5)
    assert control.should_training_stop  # past half, and still nothing better than epoch 1


def test_callback_stops_early_and_puts_back_the_best_weights():
    from transformers import TrainerControl, TrainerState

    a, b = _two_models()
    weights_a = {k: v.clone() for k, v in a.state_dict().items()}
    weights_b = {k: v.clone() for k, v in b.state_dict().items()}
    # `old` = A's own outputs, `new` = B's. Starting from A, "training" towards B wins `new` but forgets
    # `old` completely, so those epochs are not eligible and epoch 1 (still A) stays the best.
    examples = _examples(a, n=2, slice_name="old") + _examples(b, n=2, slice_name="new", seed=1)
    tracker = _RecordingTracker()
    callback = AgreementCallback(examples, tracker, k=4, selection=EpochSelection(min_slice_examples=2, patience=2))
    model, state, control = a, TrainerState(max_steps=40), TrainerControl()  # 4 epochs of 10 steps
    state.epoch = 0.0
    callback.on_train_begin(_Args(), state, control, model=model)
    _epoch(callback, model, state, control, weights_a, 1)
    _epoch(callback, model, state, control, weights_b, 2)
    assert not control.should_training_stop
    _epoch(callback, model, state, control, weights_b, 3)
    assert control.should_training_stop  # two epochs without a better one than epoch 1
    assert [s["eligible"] for s in callback.scores] == [True, True, False, False]
    callback.on_train_end(_Args(), state, control, model=model)
    assert all(torch.equal(model.state_dict()[k], weights_a[k]) for k in weights_a)
    last = callback.history[-1]
    assert last["restored"] == 1.0 and last["epoch"] == 1.0 and last[slice_key("old", "agreement")] == 1.0
    assert callback.summary()["selected_epoch"] == 1.0
    logged = [m for m, _ in tracker.calls if "eval_selection_eligible" in m]
    assert [m["eval_selection_eligible"] for m in logged] == [1.0, 1.0, 1.0, 0.0, 0.0][-len(logged):]


def test_distill_keeps_the_selected_epoch(toy_models, toy_data, tmp_path):
    import json

    from draftwheel.training.distill import DistillConfig, train_distill

    config = DistillConfig(student=str(toy_models["student"]), target=str(toy_models["target"]),
                           dataset=str(toy_data["distill"]), holdout=str(toy_data["holdout"]),
                           output_dir=str(tmp_path / "out"), learning_rate=3e-3, epochs=4, batch_size=4,
                           tracking=False, teacher_mode="online", early_stop_patience=1, eval_min_slice_examples=2)
    info = json.loads((train_distill(config) / "draftwheel_training.json").read_text())
    history, selection = info["eval_history"], info["epoch_selection"]
    assert history[0]["epoch"] == 0.0 and slice_key("code", "agreement") in history[0]
    assert selection["selected_epoch"] == history[-1]["epoch"] and selection["rule"]["patience"] == 1
    scores = selection["scores"]
    assert scores[best_evaluation(scores)]["epoch"] == selection["selected_epoch"]
    # The saved model's figures are those of the kept epoch (re-evaluated after putting its weights back).
    kept = next(h for h in history if h["epoch"] == selection["selected_epoch"])
    assert history[-1]["agreement"] == pytest.approx(kept["agreement"])


@pytest.mark.parametrize("override,field", [("early_stop_patience=-1", "early_stop_patience"),
                                            ("forgetting_tolerance=1.5", "forgetting_tolerance"),
                                            ("eval_min_slice_examples=0", "eval_min_slice_examples")])
def test_distill_selection_fields_are_validated(override, field):
    from draftwheel.config import load_config
    from draftwheel.training.distill import DistillConfig

    with pytest.raises(ValueError, match=field):
        load_config(DistillConfig, "configs/distill.yaml", [override])
    assert load_config(DistillConfig, "configs/distill.yaml") == DistillConfig()


def _mix_score(overall: float, worst: float = 0.0, eligible: bool = True) -> dict:
    return {"overall_change": overall, "worst_change": worst, "eligible": eligible}


def test_best_mix_is_a_remedy_for_forgetting():
    mixes = {1: 1.0, 2: 0.5, 3: 0.75}
    base = _mix_score(0.0)
    # The kept weights lost nothing: they stay, whatever the mixes score.
    assert best_mix([base, _mix_score(0.30, 0.01), _mix_score(0.29, 0.05), _mix_score(0.35, 0.02)], mixes, 0.75) == 1
    # They lost 2 % of a group: of the mixes holding 3/4 of the gain, the best that lost nothing.
    lost = _mix_score(0.30, -0.02)
    assert best_mix([base, lost, _mix_score(0.24, 0.01), _mix_score(0.28, 0.0)], mixes, 0.75) == 3
    assert best_mix([base, lost, _mix_score(0.24, 0.01), _mix_score(0.28, -0.01)], mixes, 0.75) == 2
    # Every holding mix lost something too: the smallest step; none holds enough: the kept weights.
    assert best_mix([base, lost, _mix_score(0.24, -0.005), _mix_score(0.28, -0.01)], mixes, 0.75) == 2
    assert best_mix([base, lost, _mix_score(0.20, -0.005), _mix_score(0.28, -0.01)], mixes, 0.75) == 3
    assert best_mix([base, lost, _mix_score(0.10, 0.01), _mix_score(0.20, 0.01)], mixes, 0.75) == 1
    # A mix beyond the tolerance is never kept; weights that gained nothing or were not eligible stay.
    assert best_mix([base, lost, _mix_score(0.3, 0.0, eligible=False), _mix_score(0.1)], mixes, 0.75) == 1
    assert best_mix([base, _mix_score(-0.02, -0.03), _mix_score(-0.01), _mix_score(-0.01)], mixes, 0.75) == 1
    assert best_mix([base, _mix_score(0.3, -0.1, eligible=False), _mix_score(0.3), _mix_score(0.3)], mixes, 0.75) == 1


class _OneWeightCallback(EpochSelectionCallback):
    """The probe as a function of one weight w: `new` gains fast at first then slowly (1 + sqrt(w)),
    `old` gains a little, then loses (2 + 0.1 w - 0.15 w^2: +0.6 % at w 0.5, -2.5 % at 1); 10 examples each."""

    def __init__(self, selection: EpochSelection):
        super().__init__(["new"] * 10 + ["old"] * 10, _RecordingTracker(), selection)

    def measure(self, model) -> dict[str, float]:
        w = float(model.weight.detach())
        new, old = 1.0 + w ** 0.5, 2.0 + 0.1 * w - 0.15 * w * w
        return {SELECTION_METRIC: (new + old) / 2, slice_key("new", SELECTION_METRIC): new,
                slice_key("old", SELECTION_METRIC): old}


def _train_one_weight(selection: EpochSelection) -> tuple[torch.nn.Linear, _OneWeightCallback]:
    from transformers import TrainerControl, TrainerState

    model = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.0)
    callback = _OneWeightCallback(selection)
    state, control = TrainerState(max_steps=20), TrainerControl()
    state.epoch = 0.0
    callback.on_train_begin(_Args(), state, control, model=model)
    for epoch in (1, 2):
        _epoch(callback, model, state, control, {"weight": torch.full((1, 1), 0.5 * epoch)}, epoch)
    callback.on_train_end(_Args(), state, control, model=model)
    return model, callback


def test_callback_keeps_the_mix_that_holds_the_gain():
    # Trained to w = 1: overall +31.7 %, old -2.5 % (eligible, but a loss). At 0.75, old -0.5 % and 90 % of
    # the gain held; at 0.5, old +0.6 % and 76 %: with mix_keep 0.7 the half step (it lost nothing), with
    # 0.8 the 3/4 step (the only one that holds enough).
    model, callback = _train_one_weight(EpochSelection(min_slice_examples=10, mixes=(0.5, 0.75), mix_keep=0.7))
    assert float(model.weight.detach()) == pytest.approx(0.5)
    assert [entry.get("mix") for entry in callback.history] == [None, None, None, 0.5, 0.75, 0.5]
    assert callback.history[-1][slice_key("new", SELECTION_METRIC)] == pytest.approx(1 + 0.5 ** 0.5)
    assert callback.summary()["selected_epoch"] == 2.0
    model, callback = _train_one_weight(EpochSelection(min_slice_examples=10, mixes=(0.5, 0.75), mix_keep=0.8))
    assert float(model.weight.detach()) == pytest.approx(0.75)
    assert callback.history[-1]["mix"] == 0.75
    # Holding 95 % of the gain: no mix does, the trained weights are saved and the last entry says so.
    model, callback = _train_one_weight(EpochSelection(min_slice_examples=10, mixes=(0.5, 0.75), mix_keep=0.95))
    assert float(model.weight.detach()) == pytest.approx(1.0)
    assert callback.history[-1].get("mix") == 1.0 and callback.history[-1]["epoch"] == 2.0


def test_callback_without_mixes_keeps_the_trained_weights():
    model, callback = _train_one_weight(EpochSelection(min_slice_examples=10))
    assert float(model.weight.detach()) == 1.0 and len(callback.history) == 3


def test_weight_mixes_are_checked():
    from draftwheel.training.eagle_train import EagleConfig

    with pytest.raises(ValueError, match="weight_mixes"):
        EagleConfig(weight_mixes=[1.5])
    with pytest.raises(ValueError, match="mix_keep"):
        EagleConfig(mix_keep=0.0)
    assert EagleConfig(weight_mixes=[0.5]).epoch_selection().mixes == (0.5,)
