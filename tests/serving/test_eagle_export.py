"""`draftwheel export` (draftwheel.serving.engine.eagle_export): a portable speculators directory, written whole or not at all.

A tiny random target and an untrained random draft (seconds on CPU): what the export writes does not
depend on how good the draft is. Each test runs the command as a user does (`draftwheel.flows.commands.main`) and
reads back the files. The round trip through the speculators library itself is the slow test in
test_speculators_roundtrip.py.
"""

from __future__ import annotations

import json
import os
import stat

import pytest
import torch
from safetensors.torch import load_file

from draftwheel.serving.engine.eagle import Eagle3Config, Eagle3Draft, Eagle3FormatError, check_export, save_eagle3, vocab_from_counts
from draftwheel.serving.engine.eagle_export import EMBED_KEY, check_portable, resolve_verifier
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.loading import load_model
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.reference import HUB_ID, REFERENCE_DIR_NAME
from draftwheel.serving.testing import build_tokenizer, save_model, tiny_llama

VERIFIER = "draftwheel-test/tiny-llama"
PROMPTS = ["def add(a, b):", "The quick brown fox", "Hello"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(target dir, draft): the target saved under the reference dir's name, as bootstrap leaves it."""
    root = tmp_path_factory.mktemp("export")
    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=4, seed=0, tie_embeddings=False)
    target_dir = save_model(target, tokenizer, root / "models" / REFERENCE_DIR_NAME)
    config = Eagle3Config.for_target(target.config, draft_vocab_size=target.config.vocab_size // 2)
    d2t, t2d = vocab_from_counts(torch.rand(target.config.vocab_size, generator=torch.Generator().manual_seed(0)),
                                 config.draft_vocab_size)
    torch.manual_seed(1)
    return target_dir, tokenizer, Eagle3Draft(config, d2t=d2t, t2d=t2d).eval()


def stored(models, path, verifier: str = "", target_sha: str = ""):
    """The draft saved as training saves it (with our own training record beside it)."""
    _, tokenizer, draft = models
    draft.c.verifier_name, draft.c.target_sha256 = verifier, target_sha
    out = save_eagle3(draft, path, tokenizer)
    (out / "draftwheel_training.json").write_text("{}")
    return out


def export(src, out, target, *flags: str) -> int:
    from draftwheel.flows.commands import main

    return main(["export", "--uri", str(src), "--target", str(target), "--out", str(out), *flags])


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_export_names_the_hub_id_carries_the_embeddings_and_is_world_readable(models, tmp_path):
    """A draft whose verifier is the reference dir's local path (what bootstrap recorded before drafts kept
    hub ids) exports with the reference's hub id; the export carries the target's embedding table exactly,
    every file is 0644 and the dir 0755, and the engine serves it with the same greedy output as the
    stored draft."""
    target_dir, _, _ = models
    src = stored(models, tmp_path / "stored", verifier=str(target_dir))
    out = tmp_path / "export"
    assert export(src, out, target_dir) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["speculators_config"]["verifier"]["name_or_path"] == HUB_ID
    weights, target = load_file(str(out / "model.safetensors")), load_file(str(target_dir / "model.safetensors"))
    assert torch.equal(weights[EMBED_KEY], target["model.embed_tokens.weight"])
    assert EMBED_KEY not in load_file(str(src / "model.safetensors"))  # the stored draft still shares it
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in src.iterdir()
                                                           if not p.name.startswith("draftwheel_"))
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o644}
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert check_portable(out).verifier_name == HUB_ID
    params = SamplingParams(max_new_tokens=16, k=3)
    served = Engine(load_model(target_dir), load_model(out)).generate(PROMPTS, params)
    local = Engine(load_model(target_dir), load_model(src)).generate(PROMPTS, params)
    assert [c.token_ids for c in served] == [c.token_ids for c in local]


def test_the_verifier_is_never_a_local_path(models, tmp_path, capsys):
    """An unknown target (a local dir of another name, or none recorded) is refused with one line naming
    --verifier, nothing written; --verifier sets the id and must itself be one."""
    target_dir, _, _ = models
    other = tmp_path / "my-target"
    other.symlink_to(target_dir)
    for recorded in (str(other), ""):
        src = stored(models, tmp_path / f"stored{len(recorded)}", verifier=recorded)
        capsys.readouterr()
        assert export(src, tmp_path / "out", target_dir) == 2
        assert "--verifier" in one_line(capsys) and not (tmp_path / "out").exists()
    assert export(src, tmp_path / "out", target_dir, "--verifier", str(target_dir)) == 2
    assert "not a local path" in one_line(capsys)
    assert export(src, tmp_path / "out", target_dir, "--verifier", VERIFIER) == 0
    assert check_portable(tmp_path / "out").verifier_name == VERIFIER
    assert resolve_verifier("org/recorded") == "org/recorded"  # a recorded hub id is kept
    assert resolve_verifier("org/recorded", "org/override") == "org/override"
    assert resolve_verifier("/cache/hub/models--org--name/snapshots/0a1b") == "org/name"


def test_a_target_the_draft_was_not_trained_for_is_refused(models, tmp_path, capsys):
    target_dir, _, _ = models
    src = stored(models, tmp_path / "stored", verifier=VERIFIER, target_sha="0" * 64)
    capsys.readouterr()
    assert export(src, tmp_path / "out", target_dir) == 2
    assert "trained for target 000000000000" in one_line(capsys) and not (tmp_path / "out").exists()


def test_a_non_empty_out_is_refused_unless_forced(models, tmp_path, capsys):
    """Exit 2 and one line, the user's files untouched and nothing else written; an empty dir is fine;
    --force replaces the dir as a whole (the user's other files go)."""
    target_dir, _, _ = models
    src = stored(models, tmp_path / "stored", verifier=VERIFIER)
    out = tmp_path / "out"
    out.mkdir()
    assert export(src, out, target_dir) == 0  # empty: taken
    (out / "notes.txt").write_text("mine")
    before = sorted(os.listdir(tmp_path))
    capsys.readouterr()
    assert export(src, out, target_dir) == 2
    assert "--force" in one_line(capsys)
    assert sorted(os.listdir(tmp_path)) == before and (out / "notes.txt").read_text() == "mine"
    assert export(src, out, target_dir, "--force") == 0
    assert not (out / "notes.txt").exists() and check_portable(out).verifier_name == VERIFIER
    assert sorted(os.listdir(tmp_path)) == before  # no temporary or set-aside dir left behind


@pytest.mark.parametrize("existing", [False, True])
def test_an_interrupted_export_leaves_no_partial_dir(models, tmp_path, monkeypatch, existing):
    """Interrupted after the files are written but before the rename: no `out`, no temporary dir, and a
    forced `out` that was there keeps its old contents."""
    import draftwheel.serving.engine.eagle_export as eagle_export

    target_dir, _, _ = models
    src = stored(models, tmp_path / "stored", verifier=VERIFIER)
    out = tmp_path / "out"
    if existing:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    before = sorted(os.listdir(tmp_path))

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(eagle_export, "check_portable", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export(src, out, target_dir, "--force")
    assert sorted(os.listdir(tmp_path)) == before
    if existing:
        assert os.listdir(out) == ["notes.txt"]


def test_export_refuses_non_eagle3_dirs_and_corrupted_masks(models, tmp_path, capsys):
    target_dir, _, _ = models
    capsys.readouterr()
    assert export(target_dir, tmp_path / "x", target_dir) == 2
    assert "not an eagle3 draft" in one_line(capsys)
    src = stored(models, tmp_path / "stored", verifier=VERIFIER)
    weights = load_file(str(src / "model.safetensors"))
    weights["t2d"] = torch.zeros_like(weights["t2d"])
    from safetensors.torch import save_file

    save_file(weights, str(src / "model.safetensors"))
    with pytest.raises(Eagle3FormatError, match="d2t/t2d"):
        check_export(src)
    assert export(src, tmp_path / "x", target_dir) == 2 and not (tmp_path / "x").exists()


def test_export_to_a_read_only_path_is_one_line_and_exit_2_as_mine(models, tmp_path, capsys, read_only_dir):
    """An output path that cannot be written is an input the user can fix: exit 2 and one line naming it,
    the code `draftwheel mine --out` gives the same error (draftwheel.exit_codes)."""
    target_dir, _, _ = models
    src = stored(models, tmp_path / "stored", verifier=VERIFIER)
    capsys.readouterr()
    assert export(src, read_only_dir / "out", target_dir) == 2
    assert str(read_only_dir / "out") in one_line(capsys)
