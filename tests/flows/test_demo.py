"""`draftwheel demo` end to end on tiny models (~40 s, in the default suite), judged by its decisions and
the direction of its figures.

The stand-in v0 knows chat and not code: it is `good` (the target's own function, see toy_world) with
the head rows zeroed of every token the target answers the demo's code prompts with and never its chat
prompts, so it drafts chat perfectly and cannot propose those code tokens. The demo then tells its story
with its own rules: the monitor finds nothing wrong on chat (its threshold is `trigger_ratio` times the
chat acceptance), the shift to code triggers it, the flywheel's stand-in trainer hands back `good`, the
gate promotes it, and on held-out prompts the new champion drafts code better than v0 and chat as well.
"""

from __future__ import annotations

import json

import torch
from transformers import AutoModelForCausalLM

from draftwheel import registry, tracking
from draftwheel.registry_names import STAGE_TAG, TARGET_SHA_TAG
from draftwheel.flows.bootstrap_flow import bootstrap_prompts
from draftwheel.flows import report
from draftwheel.flows.artifacts import DEMO_KEY, DEMO_TABLE_KEY
from draftwheel.flows.demo import DemoConfig, demo, workloads
from draftwheel.flows.flywheel import override
from draftwheel.flows.monitor import read_records
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.models import weights_sha256
from draftwheel.serving.loading import load_model
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.testing import build_tokenizer, save_model
from tests.flows.conftest import artifacts_of
from tests.flows.toy_world import build_models

SIZES = {"chat_requests": 6, "code_requests": 10, "after_requests": 2, "eval_requests": 3, "max_new_tokens": 12}


def chat_only_v0(dirs, root):
    """`good` without the head rows of the tokens the target uses on the demo's code prompts alone."""
    rows = workloads(DemoConfig(**SIZES), bootstrap_prompts())
    engine = Engine(load_model(dirs["target"]))
    params = SamplingParams(max_new_tokens=SIZES["max_new_tokens"])
    used = {name: {token for key in (name, f"eval_{name}") for row in rows[key]
                   for token in engine.generate([row["prompt"]], params, chat=True)[0].token_ids}
            for name in ("chat", "code")}
    code_only = sorted(used["code"] - used["chat"])
    model = AutoModelForCausalLM.from_pretrained(dirs["good"])
    with torch.no_grad():
        model.lm_head.weight[code_only] = 0.0
    return save_model(model, build_tokenizer(), root / "v0"), code_only


def test_demo_runs_the_whole_story_on_tiny_models(tmp_path, monkeypatch, capsys, prefect_server, one_torch_thread):
    monkeypatch.setenv("DRAFTWHEEL_HOME", str(tmp_path / "home"))
    dirs = build_models(tmp_path)
    v0_dir, code_only = chat_only_v0(dirs, tmp_path)
    assert code_only  # the code answers do use tokens the chat answers never do
    # Registered and made champion the way bootstrap does it, so the demo skips bootstrapping.
    target_sha = weights_sha256(dirs["target"])
    v0 = registry.register_version(v0_dir, "lm", {TARGET_SHA_TAG: target_sha, STAGE_TAG: "bootstrap"})
    registry.promote(v0, target_sha=target_sha)
    state = demo(None, [
        f"target={dirs['target']}", "trainer=tests.flows.toy_trainers:copy_model",
        override("train_overrides", [f"source={dirs['good']}"]), *[f"{k}={v}" for k, v in SIZES.items()],
        override("shadow_overrides", ["max_new_tokens=12", "include_canary=false", "min_requests=2"]),
        override("mining_overrides", ["holdout_fraction=0.6"]),
    ], return_state=True)
    results = state.result()
    printed = capsys.readouterr().out

    # The decisions: no trigger on chat, a trigger on code, a promotion through the gate.
    decisions = [line for line in printed.splitlines() if line.startswith("monitor: ") and "TRIGGER" in line
                 or line == "monitor: no trigger"]
    assert decisions[0] == "monitor: no trigger", decisions  # step 3: chat, before the shift
    assert decisions[1].startswith("monitor: TRIGGER") and "on code" in decisions[1], decisions  # step 5
    meta = results["meta"]
    assert meta["monitor"]["trigger"] and any("on code" in reason for reason in meta["monitor"]["reasons"])
    assert meta["promoted"] and not any(reason.startswith("FAIL") for reason in meta["decision"]), meta["decision"]
    assert meta["champion_before"] == v0 != meta["champion_after"] == tracking.aliases()["champion"]
    assert decisions[2] == "monitor: no trigger", decisions  # step 6: the new champion on code
    # Served by the batch engine, 4 requests at a time (max_batch), yet every request is logged, in order.
    assert [record.slice for record in read_records(meta["logs_dir"])] == ["chat"] * 6 + ["code"] * 12

    # The figures, each column measured on held-out prompts: code is drafted better, chat as well as before.
    before, after = results["before"], results["after"]
    assert after["code"]["acceptance_rate"] == 1.0 > before["code"]["acceptance_rate"]
    assert after["code"]["mean_accepted_length"] > before["code"]["mean_accepted_length"]
    assert after["code"]["speedup_vs_plain"] > before["code"]["speedup_vs_plain"]
    assert after["chat"]["acceptance_rate"] == before["chat"]["acceptance_rate"] == 1.0
    # As served (hybrid, over an index of the run's logs): lossless in every column. Its per-step choice of
    # source follows timed costs, so its figures have no fixed direction on tiny models.
    assert set(before) == set(after) == {"chat", "code", "chat/hybrid", "code/hybrid"}
    assert all(figures["greedy_identical"] == "3/3" and figures["requests"] == 3
               for column in (before, after) for figures in column.values())
    saved = json.loads(next((tmp_path / "home" / "demo").glob("*/results.json")).read_text())
    assert saved["after"] == results["after"] and saved["meta"]["promoted"]
    # The before/after table is also a Prefect artifact of the demo's flow run, read back through the API.
    made = artifacts_of(state.state_details.flow_run_id)
    table, = made[DEMO_TABLE_KEY]
    assert table == [dict(zip(report.HEADER, row)) for row in report.rows(results)] and table
    markdown, = made[DEMO_KEY]
    assert markdown == report.to_markdown(results)


def test_a_kept_champion_is_measured_once_and_reported_in_both_columns(tmp_path, monkeypatch):
    """When the gate keeps the champion, the before/after table measures it once: a second measurement
    of the same model would print the machine's noise as the round's change."""
    from types import SimpleNamespace

    from draftwheel.flows import demo as demo_module
    from draftwheel.flows.demo import DemoRun, _before_after
    from draftwheel.serving.engine import engine as engine_module
    from draftwheel.serving.engine.models import ModelId

    measured = []
    done = SimpleNamespace(token_ids=[1, 2], stats=SimpleNamespace(
        drafted_tokens=4, accepted_tokens=2, verify_steps=2, generated_tokens=4, latency_s=1.0),
        record=SimpleNamespace(mode="draft", steps=[SimpleNamespace(k=2, accepted=1, source=None)] * 2))

    def fake_measure(engines, rows, params):
        measured.append(sorted(engines))
        return {name: [done] * len(rows) for name in engines}

    monkeypatch.setattr(demo_module, "measure", fake_measure)
    monkeypatch.setattr(engine_module, "Engine", lambda *args, **kwargs: object())
    run = DemoRun(DemoConfig(suffix_tier=False), tmp_path)
    run.engine = SimpleNamespace(target=None)
    run.rows = {"eval_chat": [{"prompt": "a", "slice": "chat"}], "eval_code": [{"prompt": "b", "slice": "code"}]}
    v1 = SimpleNamespace(model_id=ModelId(name="draft", sha256="aa", version="1"))
    kept = _before_after(run, v1, SimpleNamespace(model_id=ModelId(name="draft", sha256="aa", version="1")))
    assert measured == [["before", "plain"]] * 2 and kept["after"] == kept["before"] != {}
    assert kept["before"]["code"]["steps_by_source"] == {"draft": {"share": 1.0, "tokens_per_step": 2.0}}
    measured.clear()
    v2 = SimpleNamespace(model_id=ModelId(name="draft", sha256="bb", version="2"))
    _before_after(run, v1, v2)
    assert measured == [["after", "before", "plain"]] * 2
