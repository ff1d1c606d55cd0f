"""Model loading, pair compatibility and the reference-target conversion (the real one, 20-30 s)."""

import hashlib

import pytest
import torch

from draftwheel.serving.engine import reference
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.engine.models import IncompatibleModelsError, UnsafeWeightsError, check_compatible, weights_sha256
from draftwheel.serving.loading import load_model
from draftwheel.serving.testing import build_tokenizer, save_model, tiny_llama




def test_load_local_dir_with_weights_hash(dirs):
    target_dir, draft_dir = dirs
    loaded = load_model(str(target_dir))
    assert loaded.model_id.name == "target" and loaded.path == target_dir
    (shard,) = sorted(target_dir.glob("*.safetensors"))
    file_hash = hashlib.sha256(shard.read_bytes()).hexdigest()
    expected = hashlib.sha256(f"{shard.name}:{file_hash}\n".encode()).hexdigest()
    assert loaded.model_id.sha256 == weights_sha256(target_dir) == expected
    assert weights_sha256(draft_dir) != expected
    assert not loaded.model.training and loaded.model.dtype == torch.float32
    check_compatible(loaded, load_model(draft_dir))  # same tokenizer: no error


def test_missing_dir_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="not a model directory"):
        load_model(str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="config.json"):
        load_model(str(tmp_path))


def test_incompatible_tokenizers_name_both_models(dirs, tmp_path):
    target_dir, _ = dirs
    other_tokenizer = build_tokenizer(vocab_size=300)
    other_dir = save_model(tiny_llama(other_tokenizer, n_layers=1), other_tokenizer, tmp_path / "other-draft")
    target, other = load_model(target_dir), load_model(other_dir)
    with pytest.raises(IncompatibleModelsError, match=r"target 'target'.*draft 'other-draft'"):
        check_compatible(target, other)
    with pytest.raises(IncompatibleModelsError):
        Engine(target, other)
    engine = Engine(target)
    with pytest.raises(IncompatibleModelsError):
        engine.swap_draft(other)
    assert engine.draft is None


def test_draft_trained_for_another_target_is_refused(dirs):
    target_dir, draft_dir = dirs
    target, draft = load_model(target_dir), load_model(draft_dir)
    draft.tags = {"target_sha256": "0" * 64}
    with pytest.raises(IncompatibleModelsError, match="trained for target weights 000000000000"):
        check_compatible(target, draft)
    draft.tags = {"target_sha256": target.model_id.sha256}
    check_compatible(target, draft)


def test_reference_gguf_is_found_and_a_wrong_hash_is_refused(tmp_path):
    gguf = reference.find_gguf()
    assert gguf.name == reference.GGUF_NAME
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF not really")
    with pytest.raises(reference.ReferenceModelError, match="does not match"):
        reference.check_gguf(fake)


def test_existing_reference_dir_is_not_reconverted(tmp_path):
    done = tmp_path / reference.REFERENCE_DIR_NAME
    done.mkdir()
    (done / "config.json").write_text("{}")
    assert reference.ensure_reference_target(tmp_path) == done


def test_reference_conversion_loads_and_generates(reference_target):
    """The shipped GGUF passes its sha256 check and converts (session fixture) into a safetensors dir that
    loads as SmolLM2-135M-Instruct (30 layers, its 49152-token vocabulary, the chat template) and answers a
    chat prompt with text."""
    from draftwheel.serving.engine.params import SamplingParams

    reference.check_gguf(reference.find_gguf())
    assert reference_target.name == reference.REFERENCE_DIR_NAME
    assert list(reference_target.glob("*.safetensors"))
    assert not reference_target.with_name(reference_target.name + ".tmp").exists()  # renamed into place
    target = load_model(reference_target)
    assert target.model.config.num_hidden_layers == 30 and len(target.tokenizer) == 49152
    assert target.tokenizer.chat_template
    completion, = Engine(target).generate(["What is 2+2?"], SamplingParams(max_new_tokens=8), chat=True)
    assert completion.text.strip() and completion.record.prompt.startswith("<|im_start|>")


def test_registry_uri_loads_version_with_tags(dirs, tmp_path, monkeypatch):
    """`models:/NAME@ALIAS` goes through draftwheel.tracking (a throwaway sqlite registry)."""
    from draftwheel import tracking

    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    target_dir, draft_dir = dirs
    target = load_model(target_dir)
    version = tracking.register_draft(draft_dir, tags={"target_sha256": target.model_id.sha256})
    tracking.set_alias(version, "champion")
    draft = load_model("models:/draftwheel-draft@champion")
    assert (draft.model_id.name, draft.model_id.version) == ("draftwheel-draft", str(version))
    assert draft.model_id.sha256 == weights_sha256(draft_dir) == draft.tags["weights_sha256"]
    assert draft.tags["target_sha256"] == target.model_id.sha256
    Engine(target, draft)  # trained for this target: accepted


def test_a_pickle_checkpoint_is_refused_before_it_is_opened(dirs, pickle_draft, monkeypatch):
    """A dir with only `pytorch_model.bin` is refused from its file list: nothing unpickles it, so the
    code its `__reduce__` carries never runs (torch.load is never even called)."""
    evil, marker = pickle_draft
    opened = []
    monkeypatch.setattr(torch, "load", lambda *args, **kwargs: opened.append(args))
    with pytest.raises(UnsafeWeightsError, match=r"no \.safetensors weights .*pytorch_model\.bin"):
        load_model(evil)
    with pytest.raises(UnsafeWeightsError):
        engine_from_specs(dirs[0], evil)
    assert not opened and not marker.exists()
