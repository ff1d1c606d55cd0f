"""End to end: traffic through `draftwheel proxy` in front of `draftwheel serve` -> records -> mine -> a round.

The toy world of tests/flows/toy_world.py: `bad` is the champion that serves, `good` computes the target's
own function. Clients talk to the proxy (chat streamed and not, completions) with the official `openai`
client; the proxy logs one record per request from what the server returned: text, slice, the
`metrics.speculative_decoding` totals, no steps and no token ids. The flywheel then mines only the proxy's
records (the target's tokenizer derives the ids), trains (the stand-in trainer hands back `good`), replays
champion and challenger on the mined hold-out per slice, and promotes; the monitor reads the same records.
"""

from __future__ import annotations

import openai
import pytest
from datasets import load_from_disk

from draftwheel import tracking
from draftwheel.flows.monitor import MonitorConfig, decide, read_records, windows
from draftwheel.mining.config import MiningConfig
from draftwheel.mining.pipeline import mine
from draftwheel.registry_names import CHAMPION_URI
from draftwheel.serving.engine.models import weights_sha256
from draftwheel.serving.engine.sink import JsonlSink
from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.server.app import ServeConfig, background_server, create_app
from draftwheel.serving.server.proxy import ProxyConfig, create_proxy_app
from draftwheel.serving.server.proxy_cli import draft_model_id
from tests.conftest import make_champion
from tests.flows.test_flywheel import run_flywheel
from tests.flows.toy_world import build_models, register_drafts, word_salads

REQUESTS = 24


def send(client: openai.OpenAI, index: int, row: dict[str, str]) -> None:
    """One request of the mix: a chat (streamed every other time), or every third one a completion."""
    extra = {"slice": row["slice"]}
    if index % 3 == 2:
        client.completions.create(model="toy", prompt=row["prompt"], max_tokens=12, temperature=0, extra_body=extra)
        return
    messages = [{"role": "user", "content": row["prompt"]}]
    if index % 2:
        list(client.chat.completions.create(model="toy", messages=messages, max_tokens=12, temperature=0,
                                            stream=True, extra_body=extra))
    else:
        client.chat.completions.create(model="toy", messages=messages, max_tokens=12, temperature=0, extra_body=extra)


@pytest.fixture(scope="module")
def world(tmp_path_factory, prefect_server, one_torch_thread):
    root = tmp_path_factory.mktemp("proxied")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DRAFTWHEEL_HOME", str(root / "home"))
        dirs = build_models(root)
        versions = register_drafts(dirs, ("bad", "good"))
        make_champion(versions["bad"])
        logs = root / "proxy-logs"
        with JsonlSink(root / "serve-logs") as serve_sink, JsonlSink(logs) as proxy_sink:
            engine = engine_from_specs(dirs["target"], CHAMPION_URI, sink=serve_sink)
            with background_server(create_app(engine, ServeConfig(served_model_name="toy"))) as serve_url:
                proxy = create_proxy_app(ProxyConfig(upstream=serve_url), proxy_sink, engine.target.tokenizer,
                                         draft_model_id(CHAMPION_URI))
                with background_server(proxy) as proxy_url:
                    client = openai.OpenAI(base_url=proxy_url + "/v1", api_key="unused", max_retries=0, timeout=120)
                    for index, row in enumerate(word_salads(REQUESTS, seed=3)):
                        send(client, index, row)
        yield {"root": root, "dirs": dirs, "versions": versions, "logs": logs}


def test_every_request_is_one_record_from_the_proxy(world):
    records = list(read_records(world["logs"]))
    assert len(records) == REQUESTS
    assert {r.source for r in records} == {"proxy:" + records[0].source.split(":", 1)[1]}
    assert all(r.steps == [] and r.prompt_token_ids == [] and r.mode == "draft" and r.drafted_tokens for r in records)
    assert {r.slice for r in records} == {"chat", "code"}
    assert {r.draft_id.version for r in records} == {world["versions"]["bad"]}


def test_mining_and_the_monitor_read_records_without_steps(world):
    manifest = mine(world["logs"], world["root"] / "mined", MiningConfig(tokenizer=str(world["dirs"]["target"]),
                                                                        holdout_fraction=0.5, plot=False))
    counts = manifest["counts"]
    assert counts["kept"] == REQUESTS and counts["quarantined"] == 0 and counts["distill"] > 0 < counts["holdout"]
    holdout = load_from_disk(str(world["root"] / "mined" / "holdout"))
    assert all(row["prompt_token_ids"] and row["output_token_ids"] for row in holdout)
    # the monitor: the proxy's records count for the champion that served them
    make_champion(world["versions"]["bad"])
    champion_sha = weights_sha256(world["dirs"]["bad"])
    config = MonitorConfig(window_requests=64, min_requests=4, min_acceptance=0.99, check_target_sha=False)
    drafted, served = windows(read_records(world["logs"]), config, champion_sha=champion_sha)
    decision = decide(drafted, config, served_records=served)
    assert decision.stats["overall"].requests == len(served) == REQUESTS
    assert decision.trigger and decision.stats["overall"].acceptance_rate < 0.99


def test_a_round_on_the_proxy_records_promotes_the_better_draft(world):
    make_champion(world["versions"]["bad"])
    result = run_flywheel(world, source="good")
    assert result["promoted"], result["decision"]
    assert tracking.aliases()["champion"] == result["challenger_version"]
    # the gate judged the hold-out mined from the proxy's records slice by slice
    members = {name for verdict in result["decision"]["slices"] for name in verdict["members"]}
    assert members == {"chat", "code"}
