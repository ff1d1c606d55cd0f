"""The flywheel with an eagle3 champion: `trainer: auto` picks the eagle trainer (the real one, on tiny
models), warm-starts from the champion, and the candidate is registered with its kind and gated by the
real shadow replay (lossless by construction)."""

from __future__ import annotations

import json

import pytest

from draftwheel import tracking
from draftwheel.registry_names import CHAMPION_URI, TARGET_SHA_TAG
from flows.flywheel import flywheel, override
from serving.eagle import Eagle3Config, Eagle3Draft, is_eagle3_dir, save_eagle3
from serving.engine import Engine
from serving.models import load_model, weights_sha256
from serving.params import SamplingParams
from serving.sink import JsonlSink
from tests.conftest import make_champion
from tests.flows.toy_world import build_models, word_salads


@pytest.fixture(scope="module")
def eagle_world(tmp_path_factory, prefect_server, one_torch_thread):
    root = tmp_path_factory.mktemp("flywheel-eagle")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTWHEEL_HOME", str(root / "home"))
        dirs = build_models(root)
        target = load_model(dirs["target"])
        v0 = Eagle3Draft(Eagle3Config.for_target(target.model.config, draft_vocab_size=128))
        save_eagle3(v0, root / "eagle-v0", target.tokenizer)
        version = tracking.register_draft(root / "eagle-v0", {TARGET_SHA_TAG: weights_sha256(dirs["target"]),
                                                             "draft_kind": "eagle3"})
        make_champion(version)
        logs = root / "logs"
        with JsonlSink(logs) as sink:
            engine = Engine.from_paths(dirs["target"], CHAMPION_URI, sink=sink)
            for row in word_salads(16):
                engine.generate([row["prompt"]], SamplingParams(max_new_tokens=12, k=3), slice=row["slice"],
                                chat=True)
        yield {"root": root, "dirs": dirs, "v0": version, "logs": logs}


def test_auto_trainer_trains_and_gates_an_eagle3_candidate(eagle_world):
    result = flywheel(None, [
        "trainer=auto", f"target={eagle_world['dirs']['target']}", f"logs_dir={eagle_world['logs']}",
        override("train_overrides", ["epochs=3", "batch_size=4", "max_length=64", "draft_vocab_size=128",
                                     "eval_k=3", "warmup_steps=0"]),
        override("mining_overrides", ["holdout_fraction=0.5"]),
        override("shadow_overrides", ["max_new_tokens=12", "min_requests=4", "include_canary=false"]),
    ])
    assert is_eagle3_dir(result["candidate_dir"])
    info = json.loads((eagle_world["root"] / "home").joinpath(result["candidate_dir"], "draftwheel_training.json")
                      .read_text())
    assert info["stage"] == "eagle" and info["metrics"]["warm_start"] == 1.0  # started from the champion
    tags = tracking.get_version_tags(result["challenger_version"])
    assert tags["draft_kind"] == "eagle3" and tags["stage"] == "eagle"
    report = json.loads(open(result["report_path"]).read())
    assert report["lossless"]["checked"] >= 4 and report["lossless"]["mismatches"] == []
