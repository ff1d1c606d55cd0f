"""Training runs chart in MLflow: the loss every `logging_steps` and the held-out figures before training and
after every epoch carry their global step, so MLflow keeps a history per metric (what its UI draws as a
chart), and the closing figures do not land on step 0 of those charts.

Tiny runs of the distillation and EAGLE-3 trainers on the toy models (tests/training/conftest.py), tracked in
the test's own state dir; the histories are read back with MLflow's client.
"""

from __future__ import annotations

import mlflow
from mlflow import MlflowClient

from draftwheel import tracking
from draftwheel.training.distill import DistillConfig, train_distill
from draftwheel.training.eagle_train import EagleConfig, train_eagle


def history(stage: str) -> dict[str, list[tuple[int, float]]]:
    """{metric: [(step, value), ...]} of the one run of `stage` in the state dir's store."""
    tracking.setup_mlflow()
    run, = mlflow.search_runs(experiment_names=[tracking.EXPERIMENT], filter_string=f"tags.stage = '{stage}'",
                              output_format="list")
    client = MlflowClient()
    return {key: [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, key)]
            for key in run.data.metrics}


def check_charts(metrics: dict[str, list[tuple[int, float]]], held_out: str) -> None:
    (last_step, steps_run), = metrics["steps"]  # the run's global steps, logged once at its last step
    assert last_step == steps_run > 1
    steps = [step for step, _ in metrics["train_loss"]]
    assert len(steps) > 1 and steps == sorted(set(steps)) and steps[-1] <= last_step, metrics["train_loss"]
    evaluations = [step for step, _ in metrics[held_out]]
    # before training (step 0), then after each epoch; one point per step (the closing log adds none)
    assert evaluations[0] == 0 and len(evaluations) > 2 and evaluations == sorted(set(evaluations)), evaluations
    assert evaluations[-1] == last_step
    assert [step for step, _ in metrics["train_loss_mean"]] == [last_step]  # the closing figures: at the end
    assert not any(key.startswith("train_train_") for key in metrics)


def test_distillation_logs_charts_by_step(toy_models, toy_data, tmp_path):
    config = DistillConfig(student=str(toy_models["student"]), target=str(toy_models["target"]),
                           dataset=str(toy_data["distill"]), holdout=str(toy_data["holdout"]),
                           output_dir=str(tmp_path / "out"), learning_rate=3e-3, max_steps=8, batch_size=4,
                           logging_steps=2, tracking=True, teacher_mode="online", freeze_embeddings=True,
                           keep_best_epoch=False, early_stop_patience=0)
    train_distill(config)
    check_charts(history("distill"), "eval_agreement")


def test_eagle_training_logs_charts_by_step(toy_models, toy_data, tmp_path):
    config = EagleConfig(student="", target=str(toy_models["target"]), dataset=str(toy_data["distill"]),
                         output_dir=str(tmp_path / "out"), draft_vocab_size=128, epochs=3, batch_size=4,
                         learning_rate=1e-2, ttt_steps=2, eval_k=2, tracking=True, max_length=64, warmup_steps=0,
                         logging_steps=1, feature_cache=str(tmp_path / "cache"), probe_canary=False,
                         early_stop_patience=0, keep_best_epoch=False)
    train_eagle(config)
    check_charts(history("eagle"), "eval_implied_mal")
