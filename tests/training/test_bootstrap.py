"""Bootstrap on a toy target: the draft copies target layers, is distilled (agreeing with the target better
than a random control), registered, and re-runs skip."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from draftwheel import home
from draftwheel.config import ConfigError, load_config
from draftwheel.serving import testing as toy
from draftwheel.training.bootstrap import BootstrapConfig, bootstrap, init_draft_from_target

from .conftest import PROMPTS


def test_init_draft_copies_chosen_layers_and_shared_weights():
    target = toy.tiny_llama(toy.build_tokenizer(), n_layers=4, seed=0, tie_embeddings=False)
    draft = init_draft_from_target(target, [0, -1])
    assert draft.config.num_hidden_layers == 2 and target.config.num_hidden_layers == 4
    assert torch.equal(draft.model.layers[1].mlp.down_proj.weight, target.model.layers[3].mlp.down_proj.weight)
    assert torch.equal(draft.model.layers[0].self_attn.q_proj.weight, target.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(draft.lm_head.weight, target.lm_head.weight)
    assert torch.equal(draft.model.norm.weight, target.model.norm.weight)
    with pytest.raises(ValueError, match="init_layers"):
        init_draft_from_target(target, [4])


def test_bootstrap_builds_registers_and_is_idempotent(tmp_path):
    from draftwheel.tracking import get_alias_version, get_version_tags
    from draftwheel.serving.engine.models import weights_sha256

    tokenizer = toy.build_tokenizer()
    target_dir = toy.save_model(toy.tiny_llama(tokenizer, n_layers=3, seed=0, tie_embeddings=False), tokenizer,
                                tmp_path / "target")
    workload = [{"prompt": p, "slice": "chat"} for p in PROMPTS]
    config = BootstrapConfig(target=str(target_dir), draft_kind="lm", init_layers=[0, 2], n_prompts=6,
                             holdout_prompts=2, max_new_tokens=8, gen_batch_size=8, top_k=8, epochs=1,
                             learning_rate=2e-3, tracking=False)
    first = bootstrap(config, workload=workload)
    assert first["built"] and first["registered"]
    assert get_alias_version("champion") == first["version"]
    assert get_version_tags(first["version"])["target_sha256"] == weights_sha256(target_dir)
    assert get_version_tags(first["version"])["draft_kind"] == "lm"
    draft = AutoModelForCausalLM.from_pretrained(first["draft_dir"])
    assert draft.config.num_hidden_layers == 2
    # The recorded agreement is the saved draft's, and copying target layers then distilling beats a random
    # draft of the same shape on the same held-out outputs (the control agrees by chance only).
    from draftwheel.training.data import load_holdout
    from draftwheel.training.evaluate import evaluate_agreement

    holdout = load_holdout(next((tmp_path / "home" / "datasets" / "bootstrap").glob("*/holdout")))
    measured = evaluate_agreement(draft, holdout, progress=False)["agreement"]
    control = evaluate_agreement(toy.tiny_llama(tokenizer, n_layers=2, seed=5, tie_embeddings=False), holdout,
                                 progress=False)["agreement"]
    assert first["metrics"]["eval_agreement"] == pytest.approx(measured) and first["metrics"]["steps"] > 0
    assert measured > control + 0.15, (measured, control)
    again = bootstrap(config, workload=workload)
    assert not again["built"] and not again["registered"] and again["version"] == first["version"]


def test_bootstrap_builds_an_eagle3_v0_by_default(tmp_path):
    """The default kind: an eagle3 v0 trained on the target's completions plus offline text, registered
    with its kind, and served by the Engine with output identical to the target alone."""
    from draftwheel.tracking import get_version_tags
    from draftwheel.serving.engine.engine import Engine
    from draftwheel.serving.loading import load_model
    from draftwheel.serving.engine.params import SamplingParams

    tokenizer = toy.build_tokenizer()
    target_dir = toy.save_model(toy.tiny_llama(tokenizer, n_layers=3, seed=0, tie_embeddings=False), tokenizer,
                                tmp_path / "target")
    workload = [{"prompt": p, "slice": "chat"} for p in PROMPTS]
    config = BootstrapConfig(target=str(target_dir), n_prompts=6, holdout_prompts=2, max_new_tokens=8,
                             text_sequences=4, epochs=2, learning_rate=5e-3, tracking=False)
    assert config.draft_kind == "eagle3"
    result = bootstrap(config, workload=workload)
    assert result["built"] and get_version_tags(result["version"])["draft_kind"] == "eagle3"
    # generation stored the completions' feature rows: the training computed only the 4 text sequences'
    assert result["metrics"]["feature_cache_hit"] == pytest.approx(6 / (6 + 4))
    engine = Engine(load_model(target_dir), load_model(result["draft_dir"]))
    assert engine.draft.kind == "eagle3"
    params = SamplingParams(max_new_tokens=12, k=3)
    plain = engine.generate(PROMPTS[:3], params, mode="autoregressive")
    assert [c.token_ids for c in engine.generate(PROMPTS[:3], params)] == [c.token_ids for c in plain]


def test_the_v0s_features_come_from_generation_as_a_forward_would_give_them(tmp_path):
    """Bootstrap's generation keeps the hidden states of the layers an eagle3 v0 reads and stores them as
    the feature rows of the sequences its training will load (the completions cut at max_new_tokens and
    those ended by an EOS alike): what a teacher-forced forward over the same sequences gives."""
    from draftwheel.serving.engine.eagle import default_aux_layer_ids
    from draftwheel.serving.loading import load_model
    from draftwheel.training.bootstrap import _traffic
    from draftwheel.training.eagle_features import compute_features, row_path
    from draftwheel.training.eagle_train import feature_cache_root, load_sequences
    from safetensors.torch import load_file

    tokenizer = toy.build_tokenizer()
    target_dir = toy.save_model(toy.tiny_llama(tokenizer, n_layers=3, seed=0, tie_embeddings=False), tokenizer,
                                tmp_path / "target")
    target = load_model(target_dir)
    config = BootstrapConfig(target=str(target_dir), n_prompts=4, holdout_prompts=2, max_new_tokens=8,
                             tracking=False)
    data = _traffic(config, target, tmp_path / "traffic", [{"prompt": p, "slice": "chat"} for p in PROMPTS[:6]])
    aux = default_aux_layer_ids(3)
    lengths = []
    for part, column in (("distill", "completion_token_ids"), ("holdout", "output_token_ids")):
        seqs = load_sequences(data[part], config.max_length, column)
        forward = compute_features(target.model, seqs.ids, aux, progress=False)
        for i, ids in enumerate(seqs.ids):
            stored = load_file(str(row_path(feature_cache_root(), ids, target.model_id.sha256, aux, False)))
            aux_fwd, hidden_fwd, argmax_fwd = forward.sequence(i)
            torch.testing.assert_close(stored["aux"].float(), aux_fwd.float(), atol=2e-3, rtol=2e-3)
            torch.testing.assert_close(stored["hidden"].float(), hidden_fwd.float(), atol=2e-3, rtol=2e-3)
            assert torch.equal(stored["argmax"], argmax_fwd)
        lengths += [len(ids) - p for ids, p in zip(seqs.ids, seqs.prompt_lens)]
    assert max(lengths) == 8  # the token generated past the limit for its states is not in the row


def test_sampled_completions_add_training_rows_only(tmp_path):
    """`sampled_completions` n: each training prompt gets n more, sampled, completions in `distill/` (the
    hold-out keeps the greedy ones alone), under their own dataset key."""
    from datasets import load_from_disk

    tokenizer = toy.build_tokenizer()
    target_dir = toy.save_model(toy.tiny_llama(tokenizer, n_layers=3, seed=0, tie_embeddings=False), tokenizer,
                                tmp_path / "target")
    workload = [{"prompt": p, "slice": "chat"} for p in PROMPTS[:6]]
    config = BootstrapConfig(target=str(target_dir), n_prompts=4, holdout_prompts=2, max_new_tokens=8,
                             text_sequences=0, epochs=1, tracking=False, register=False,
                             sampled_completions=2, sample_temperature=1.0)
    bootstrap(config, workload=workload)
    data, = (home.datasets_dir() / "bootstrap").glob("*-s2t1-*")
    distill, holdout = load_from_disk(str(data / "distill")), load_from_disk(str(data / "holdout"))
    assert len(distill) == 4 * 3 and len(holdout) == 2
    greedy = distill["completion_token_ids"][:4]
    assert sorted(distill["prompt"]) == sorted(distill["prompt"][:4] * 3)
    assert distill["completion_token_ids"][4:] != greedy + greedy  # draws, not the greedy answers again
    with pytest.raises(ValueError, match="sampled_completions"):
        BootstrapConfig(sampled_completions=-1)


def test_bootstrap_config_validation():
    with pytest.raises(ValueError, match="draft_kind"):
        BootstrapConfig(draft_kind="tree")
    with pytest.raises(ValueError, match="init_layers"):
        BootstrapConfig(init_layers=[])
    with pytest.raises(ValueError, match="draft_name"):
        BootstrapConfig(draft_name="a/b")
    with pytest.raises(ValueError, match="n_prompts"):
        BootstrapConfig(n_prompts=0)
    assert load_config(BootstrapConfig, "configs/bootstrap.yaml").init_layers == [0, 1]
    with pytest.raises(ConfigError, match="bf16"):
        load_config(BootstrapConfig, overrides=["bf16=fast"])


def test_bf16_auto_is_resolved_once_in_the_configs(monkeypatch):
    """The trainers see a bool: what ran (cache keys, MLflow params), not the request."""
    from draftwheel.training.eagle_train import EagleConfig

    for has_amx in (True, False):
        monkeypatch.setattr("draftwheel.serving.engine.precision.cpu_has_bf16_matmul", lambda has_amx=has_amx: has_amx)
        assert load_config(EagleConfig, "configs/eagle.yaml").bf16 is has_amx  # the shipped default: auto
        assert load_config(BootstrapConfig, overrides=["bf16=auto"]).bf16 is has_amx
    assert load_config(EagleConfig, overrides=["bf16=true"]).bf16 is True


@pytest.mark.parametrize("matmul, serves", [(True, True), (True, False), (False, False)])
def test_the_targets_side_of_training_follows_the_precision_it_serves_in(monkeypatch, matmul, serves):
    """`target_bf16: auto`: the target generates and computes features in bfloat16 only where the draft
    trains in it and the target also serves in it; elsewhere the draft may train under autocast while
    the target stays float32, as serving runs it. Explicit values stand."""
    from draftwheel.serving.engine.precision import resolve_target_bf16
    from draftwheel.training.eagle_train import EagleConfig

    monkeypatch.setattr("draftwheel.serving.engine.precision.cpu_has_bf16_matmul", lambda: matmul)
    monkeypatch.setattr("draftwheel.serving.engine.precision.cpu_serves_bf16", lambda: serves)
    config = load_config(EagleConfig, "configs/eagle.yaml")
    assert (config.bf16, config.target_bf16) == (matmul, serves)
    assert load_config(BootstrapConfig, overrides=["bf16=auto", "draft_kind=eagle3"]).bf16_eagle is serves
    assert load_config(EagleConfig, overrides=["bf16=false"]).target_bf16 is False
    assert resolve_target_bf16("true", False) is True and resolve_target_bf16(False, True) is False
    with pytest.raises(ConfigError, match="target_bf16"):
        load_config(EagleConfig, overrides=["target_bf16=fast"])
