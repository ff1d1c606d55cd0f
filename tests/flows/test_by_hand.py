"""The stages connect by default: `traffic`, `mine`, `train distill`, `shadow`, `promote`
typed by hand with no path flags give what the flywheel gives from the same logs, with the real distill
trainer on tiny models and MLflow's real sqlite store.

The tiny target stands in for the reference target by sitting where the reference target is converted
to (`<state>/models/smollm2-135m-instruct`), so no command needs `--target` either. The champion is the
random `bad` draft of toy_world; see there why the target's own function is learnable.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from draftwheel import home, tracking
from draftwheel.flows.commands import main
from draftwheel.registry_names import STAGE_TAG, TARGET_SHA_TAG
from draftwheel.flows.flywheel import flywheel, override
from draftwheel.serving.engine.reference import default_target_dir
from tests.conftest import make_champion
from tests.flows.toy_world import build_models, register_drafts, word_salads

TRAIN = ["epochs=2", "batch_size=4", "max_length=64", "eval_max_samples=4", "logging_steps=1"]
SHADOW = ["max_new_tokens=12", "min_requests=4", "include_canary=false"]
MINING = ["holdout_fraction=0.5"]


@pytest.fixture(scope="module")
def state(tmp_path_factory, prefect_server, one_torch_thread):
    root = tmp_path_factory.mktemp("by_hand")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTWHEEL_HOME", str(root / "home"))
        dirs = build_models(root)
        shutil.copytree(dirs["target"], default_target_dir())
        champion = register_drafts(dirs, ("bad",))["bad"]
        make_champion(champion)
        workload = root / "prompts.jsonl"
        workload.write_text("".join(json.dumps(row) + "\n" for row in word_salads(16)))
        yield {"root": root, "dirs": dirs, "champion": champion, "workload": workload}


def last_line(capsys) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_by_hand_sequence_gets_what_the_flywheel_gets(state, capsys):
    assert main(["traffic", "--workload", str(state["workload"]), "--max-new-tokens", "12", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["requests"] == 16
    assert main(["mine", *[a for kv in MINING for a in ("--set", kv)]]) == 0
    assert json.loads(capsys.readouterr().out)["out"] == str(home.mined_dir())
    assert main(["train", "distill", *TRAIN]) == 0
    candidate = last_line(capsys)
    code = main(["shadow", "--challenger", candidate, *[a for kv in SHADOW for a in ("--set", kv)]])
    assert code in (0, 3)  # the gate decides; either way the candidate is registered with its verdict
    registered = json.loads(last_line(capsys).split("registry: ", 1)[1])["version"]
    assert main(["promote", registered]) == 0  # an explicit promote is allowed either way
    assert tracking.aliases()["champion"] == registered

    # The trainer's MLflow run, in the state dir's sqlite store: finished, with its config and metrics.
    with sqlite3.connect(home.state_dir() / "mlflow.db") as db:
        runs = db.execute("SELECT r.run_uuid, r.status FROM runs r JOIN params p ON p.run_uuid = r.run_uuid "
                          "WHERE p.key = 'loss'").fetchall()
        assert [status for _, status in runs] == ["FINISHED"]
        metrics = {k for (k,) in db.execute("SELECT DISTINCT key FROM metrics WHERE run_uuid = ?", (runs[0][0],))}
    assert "train_loss" in metrics and any(k.startswith("eval_") for k in metrics), metrics

    # The flywheel from the same logs and the same champion mines the same data and trains the same kind.
    make_champion(state["champion"])
    result = flywheel(None, ["trainer=distill", override("train_overrides", TRAIN),
                             override("mining_overrides", MINING), override("shadow_overrides", SHADOW)])
    outputs = [json.loads((root / "manifest.json").read_text())["outputs"]
               for root in (home.mined_dir(), Path(result["work_dir"]) / "datasets")]
    assert {k: outputs[0][k]["sha256"] for k in home.DATASET_KINDS} == {k: outputs[1][k]["sha256"] for k in home.DATASET_KINDS}
    by_hand, wheel = (tracking.get_version_tags(v) for v in (registered, result["challenger_version"]))
    assert by_hand[STAGE_TAG] == wheel[STAGE_TAG] == "distill"
    assert by_hand[TARGET_SHA_TAG] == wheel[TARGET_SHA_TAG]
