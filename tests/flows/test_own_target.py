"""Your own target in one step: `draftwheel bootstrap --target DIR` on a second architecture (a tiny
Qwen2: tied embeddings, grouped-query attention, biased q/k/v, five layers where the reference has thirty),
then `status`, `generate` and `serve` with no `--target`: each follows the target the champion records.

The eagle3 v0 reads three of the target's layers (EAGLE-3's first / middle / last for a shallow target) and
shares its tied embedding table; served output stays identical to the target's own greedy decoding."""

from __future__ import annotations

import argparse
import json
import shutil

import httpx
import pytest

from draftwheel import tracking
from draftwheel.flows.commands import main
from draftwheel.registry_names import TARGET_DIR_TAG, TARGET_SHA_TAG
from draftwheel.serving import testing as toy
from draftwheel.serving.engine.models import weights_sha256
from draftwheel.serving.engine.records import parse_record
from draftwheel.serving.engine.sink import iter_lines

# Small enough for a test (8 chat prompts, 8 tokens each, 2 epochs): ~8 s on 2 cores.
TINY = ["n_prompts=6", "holdout_prompts=2", "max_new_tokens=8", "text_sequences=4", "epochs=2", "tracking=false"]
PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def qwen(tmp_path_factory, module_home):
    """The tiny Qwen2 target's dir, bootstrapped: its v0 registered as champion."""
    tokenizer = toy.build_tokenizer()
    target = toy.save_model(toy.tiny_qwen2(tokenizer), tokenizer, tmp_path_factory.mktemp("qwen") / "target")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        assert main(["bootstrap", "--target", str(target), *TINY]) == 0
        yield target


def _json_out(capsys) -> dict:
    """The JSON a command printed last (indented: its first line is a lone brace), after any progress lines."""
    lines = capsys.readouterr().out.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    return json.loads("\n".join(lines[start:]))


def _serve_config(*argv: str):
    from draftwheel.serving.server.cli import build_config, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return build_config(parser.parse_args(["serve", *argv]))


def test_bootstrap_registers_the_v0_with_where_its_target_is(qwen, capsys):
    tags = tracking.get_version_tags(tracking.get_alias_version("champion"))
    assert tags[TARGET_SHA_TAG] == weights_sha256(qwen) and tags[TARGET_DIR_TAG] == str(qwen)
    assert tags["draft_kind"] == "eagle3" and tags["stage"] == "bootstrap"
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert f"target (commands given no --target): {qwen}" in out
    assert "champion" in out and weights_sha256(qwen)[:12] in out


def test_generate_and_serve_follow_the_champions_target(qwen, capsys):
    assert main(["generate", "--prompt", PROMPT, "--max-new-tokens", "16", "--json"]) == 0
    spec = _json_out(capsys)["record"]
    assert spec["target_id"]["sha256"] == weights_sha256(qwen) and spec["draft_id"]["version"] == "1"
    assert main(["generate", "--prompt", PROMPT, "--max-new-tokens", "16", "--json", "--no-draft"]) == 0
    plain = _json_out(capsys)["record"]
    assert plain["target_id"]["sha256"] == weights_sha256(qwen)  # no draft: still the champion's target
    assert spec["output_token_ids"] == plain["output_token_ids"]  # lossless on this architecture
    assert spec["accepted_tokens"] > 0  # the eagle3 draft reads this target's features usefully

    from draftwheel.serving.server.app import background_server, create_app
    from draftwheel.serving.server.cli import open_engine

    config = _serve_config("--served-model-name", "qwen")
    assert config.target is None and config.device == "auto"
    engine, sink = open_engine(config)
    try:
        assert engine.target.path == qwen and engine.target.model.device.type == "cpu"  # auto: no GPU here
        assert engine.draft.kind == "eagle3" and engine.draft.model_id.version == "1"
        draft = engine.draft.model
        assert draft.c.aux_layer_ids == [0, 2, 4]  # a 5-layer target: first, middle, last
        assert draft.embed_tokens is engine.target.model.get_input_embeddings()  # the tied table, shared
        with background_server(create_app(engine, config)) as url:
            reply = httpx.post(url + "/v1/completions", json={"model": "qwen", "prompt": PROMPT, "max_tokens": 16,
                                                              "temperature": 0, "slice": "own-target"}, timeout=60)
        assert reply.status_code == 200, reply.text
    finally:
        sink.close()
    record, = [parse_record(line) for *_, line in iter_lines(sink.log_dir) if '"own-target"' in line]
    assert record.target_id.sha256 == weights_sha256(qwen) and record.draft_id.version == "1"
    assert record.output_token_ids == plain["output_token_ids"]


def test_a_gone_target_is_one_line_and_status_still_answers(qwen, capsys, tmp_path):
    from draftwheel.config import ConfigError
    from draftwheel.serving.server.cli import open_engine

    away = tmp_path / "away"
    shutil.move(qwen, away)
    try:
        assert main(["generate", "--prompt", PROMPT, "--max-new-tokens", "4"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and f"target at {qwen}" in err and "which is gone" in err, err
        with pytest.raises(ConfigError, match="which is gone"):
            open_engine(_serve_config())
        assert main(["status"]) == 0
        assert "which is gone" in capsys.readouterr().out
        assert main(["generate", "--prompt", PROMPT, "--max-new-tokens", "4", "--target", str(away)]) == 0
    finally:
        shutil.move(away, qwen)


def test_bootstrapping_another_target_moves_the_champion_and_rollback_returns(qwen, tmp_path, capsys):
    from draftwheel.serving.loading import resolve_target

    tokenizer = toy.build_tokenizer()
    llama = toy.save_model(toy.tiny_llama(tokenizer, n_layers=3, seed=2, tie_embeddings=False), tokenizer,
                           tmp_path / "llama")
    assert main(["bootstrap", "--target", str(llama), *TINY]) == 0
    result = _json_out(capsys)
    assert result["registered"] and result["built"] and result["draft_dir"].endswith(weights_sha256(llama)[:12])
    assert tracking.aliases() == {"champion": result["version"], "previous": "1"}
    assert resolve_target() == str(llama)
    assert main(["bootstrap", *TINY]) == 0  # given no target: the champion's, already bootstrapped
    again = _json_out(capsys)
    assert not again["registered"] and not again["built"] and again["version"] == result["version"]
    assert main(["rollback"]) == 0
    assert resolve_target() == str(qwen)
