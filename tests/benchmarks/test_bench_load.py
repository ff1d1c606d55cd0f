"""benchmarks/bench_load.py's measurements against servers in this process (the command starts `draftwheel
serve` per setting, which takes longer than a smoke test should): a level runs every request at the
concurrency asked (or at Poisson arrivals) and reports its figures, and the greedy identity between two servers' logs names each
divergence with the target's logit margin there."""

from __future__ import annotations

from draftwheel.serving.engine.sink import JsonlSink
from draftwheel.serving.loading import engine_from_specs, load_model
from draftwheel.serving.server.app import ServeConfig, background_server, create_app
from draftwheel.serving.testing import tiny_pair


def test_help(load_benchmark, help_text):
    text = help_text(load_benchmark("bench_load"))
    assert "--concurrency" in text and "batched-hybrid" in text


def test_levels_and_greedy_identity_between_two_servers(load_benchmark, tmp_path):
    bench = load_benchmark("bench_load")
    target, _ = tiny_pair(tmp_path / "pair")
    prompts = bench.mixed_prompts(6, seed=0)
    assert len(set(prompts)) == 6
    logs = {}
    for scheduler in ("serial", "batched"):
        sink = JsonlSink(tmp_path / scheduler, flush_every=1)
        config = ServeConfig(served_model_name="toy", scheduler=scheduler, mode="autoregressive", max_batch=4)
        with background_server(create_app(engine_from_specs(target, sink=sink), config)) as url:
            level = bench.run_level(url, prompts, concurrency=3, max_tokens=6)
            arrivals = bench.run_poisson(url, prompts[:3], rate=50.0, max_tokens=4, seed=1)
        sink.close()
        assert arrivals["rate_per_s"] == 50.0 and arrivals["completed"] == 3 and not arrivals["errors"]
        assert arrivals["output_tokens"] > 0 and arrivals["ttft_p50_s"] > 0
        assert level["completed"] == 6 and not level["errors"] and level["output_tokens"] > 0
        assert 0 < level["ttft_p50_s"] <= level["ttft_p99_s"] and level["output_tokens_per_s"] > 0
        logs[scheduler] = bench.logged_outputs(tmp_path / scheduler)
    loaded = load_model(target)
    assert bench.greedy_identity(logs["serial"], logs["batched"], loaded) == {"identical": "6/6", "divergences": []}
    changed = dict(logs["batched"])
    prompt, record = next(iter(changed.items()))
    changed[prompt] = {**record, "output_token_ids": record["output_token_ids"][:2] + [7, 7]}
    identity = bench.greedy_identity(logs["serial"], changed, loaded)
    assert identity["identical"] == "5/6"
    divergence, = identity["divergences"]
    assert divergence["position"] == 2 and divergence["logit_margin"] > 0  # the reference's token was the argmax


def test_burst_messages_share_one_system_prompt(load_benchmark):
    bench = load_benchmark("bench_load")
    chats = bench.burst_messages(3, words=40)
    assert len({c[0]["content"] for c in chats}) == 1 and len(chats[0][0]["content"].split()) == 40
    assert len({c[1]["content"] for c in chats}) == 3

