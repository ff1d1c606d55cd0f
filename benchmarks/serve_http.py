"""Cost of the HTTP layer and of the acceptance log, measured in one run on the same model dirs.

Greedy chat completions of the same prompts, interleaved prompt by prompt over three paths:
in-process `Engine.generate` (in this process), HTTP non-streaming and HTTP streaming (SSE) with the
official `openai` client against `draftwheel serve` running in its own process (so client and server
do not share a GIL). Then the same prompts from 4 concurrent clients (queued by the server) against
the sequential HTTP run. Prints throughput ratios and how many outputs are identical across the three
paths. Separately: records/s of `JsonlSink` with an fsync per record against the default batch of 32,
and the sink's cost per request relative to the mean request latency.

    .venv/bin/python benchmarks/serve_http.py --pair reference
    .venv/bin/python benchmarks/serve_http.py --pair toy

`reference`: the reference target (SmolLM2-135M-Instruct) with a draft made of its first 2 layers.
`toy`: tiny random models (draftwheel.serving.testing): a fast engine, where HTTP overhead is most visible.
The JSON goes to --out (default $DRAFTWHEEL_HOME/benchmarks/serve_http_<pair>.json) and the run to MLflow.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench_io import add_output_arguments, save
# The same prompts as the engine benchmark, so the two sets of figures compare.
from bench_serving import PROMPTS  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]


def save_pair(pair: str, root: Path) -> tuple[Path, Path]:
    """Write the target and draft model dirs of `pair` under `root`."""
    from draftwheel.serving.testing import build_tokenizer, save_model, tiny_llama

    if pair == "toy":
        tokenizer = build_tokenizer()
        target = tiny_llama(tokenizer, n_layers=4, hidden=128, seed=1, tie_embeddings=False)
        draft = tiny_llama(tokenizer, n_layers=1, hidden=128, seed=2)
        return save_model(target, tokenizer, root / "target"), save_model(draft, tokenizer, root / "draft")
    from draftwheel.home import models_dir
    from draftwheel.serving.loading import load_model
    from draftwheel.serving.engine.reference import ensure_reference_target

    target_dir = ensure_reference_target(models_dir())
    loaded = load_model(target_dir)
    draft = loaded.model
    draft.model.layers = draft.model.layers[:2]  # same embeddings, head and vocab; 2 of 30 layers
    draft.config.num_hidden_layers = 2
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:2]
    return target_dir, save_model(draft, loaded.tokenizer, root / "draft-first-2-layers")


def start_server(target: Path, draft: Path, log_dir: Path) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "draftwheel.flows.commands", "serve", "--target", str(target), "--draft", str(draft),
         "--port", str(port), "--log-dir", str(log_dir), "--set", "default_temperature=0",
         # The same decoding on both sides (mode draft): with the suffix tier the server would also learn
         # the prompts each round repeats, and the figure would no longer be the HTTP layer's cost.
         "--set", "suffix_tier=false"],
        cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("draftwheel serve did not come up")
        try:
            httpx.get(url + "/healthz")
            return proc, url
        except httpx.TransportError:
            time.sleep(0.5)


def measure_paths(engine, url: str, prompts: list[str], max_new_tokens: int, rounds: int) -> dict:
    import openai

    from draftwheel.serving.engine.params import SamplingParams

    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    params = SamplingParams(max_new_tokens=max_new_tokens)
    kwargs = {"model": model, "max_tokens": max_new_tokens, "temperature": 0}

    def inproc(prompt: str) -> tuple[str, int]:
        completion = engine.generate([prompt], params, chat=True)[0]
        inproc_latencies.append(completion.stats.latency_s)
        return completion.text, len(completion.token_ids)

    def http(prompt: str) -> tuple[str, int]:
        response = client.chat.completions.create(messages=[{"role": "user", "content": prompt}], **kwargs)
        return response.choices[0].message.content, response.usage.completion_tokens

    def stream(prompt: str) -> tuple[str, int]:
        chunks = list(client.chat.completions.create(messages=[{"role": "user", "content": prompt}], stream=True,
                                                     stream_options={"include_usage": True}, **kwargs))
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].usage.completion_tokens

    inproc_latencies: list[float] = []
    http_walls: list[tuple[str, float]] = []  # in server order: matched to its records afterwards
    paths = {"inproc": inproc, "http": http, "http_stream": stream}
    for name, fn in paths.items():  # warm-up
        start = time.perf_counter()
        fn(prompts[0])
        if name != "inproc":
            http_walls.append((name, time.perf_counter() - start))
    # Each prompt runs on every path back to back (so load drift hits all paths alike); the time per
    # prompt and path is the median over `rounds`, which drops bursts from other jobs on the machine.
    times: dict[str, list[list[float]]] = {name: [[] for _ in prompts] for name in paths}
    outputs: dict[str, list[tuple[str, int]]] = {name: [] for name in paths}
    for _ in range(rounds):
        for i, prompt in enumerate(prompts):
            for name, fn in paths.items():
                start = time.perf_counter()
                out = fn(prompt)
                times[name][i].append(time.perf_counter() - start)
                if name != "inproc":
                    http_walls.append((name, times[name][i][-1]))
                if len(outputs[name]) <= i:
                    outputs[name].append(out)
    seconds = {name: sum(statistics.median(t) for t in per_prompt) for name, per_prompt in times.items()}
    tokens = {name: sum(n for _, n in outs) for name, outs in outputs.items()}
    identical = sum(outputs["inproc"][i] == outputs["http"][i] == outputs["http_stream"][i]
                    for i in range(len(prompts)))
    result = {f"{name}_tokens_per_s": tokens[name] / s for name, s in seconds.items()}
    result.update({"http_vs_inproc": result["http_tokens_per_s"] / result["inproc_tokens_per_s"],
                   "stream_vs_inproc": result["http_stream_tokens_per_s"] / result["inproc_tokens_per_s"],
                   "identical_outputs": f"{identical}/{len(prompts)}", "generated_tokens": tokens["inproc"],
                   "inproc_median_latency_s": statistics.median(inproc_latencies), "_http_walls": http_walls})
    result.update(measure_concurrency(http, prompts, tokens["http"] / seconds["http"]))
    return result


def http_overheads(walls: list[tuple[str, float]], records: list[dict]) -> dict:
    """Client wall time minus the server's own decoding time (record latency_s), per sequential request."""
    per_path: dict[str, list[float]] = {}
    server_latency: list[float] = []
    for (name, wall), record in zip(walls, records):
        per_path.setdefault(name, []).append(wall - record["latency_s"])
        server_latency.append(record["latency_s"])
    result = {f"{name}_overhead_ms_median": 1000 * statistics.median(v) for name, v in per_path.items()}
    result["server_median_latency_s"] = statistics.median(server_latency)
    return result


def measure_concurrency(http, prompts: list[str], sequential_tokens_per_s: float, clients: int = 4) -> dict:
    """The same prompts from `clients` threads at once: the server queues them; compare throughput."""
    queue, counts, lock = list(prompts), [], threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                prompt = queue.pop()
            counts.append(http(prompt)[1])

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rate = sum(counts) / (time.perf_counter() - start)
    return {"concurrent_clients": clients, "concurrent_completed": f"{len(counts)}/{len(prompts)}",
            "concurrent_tokens_per_s": rate, "concurrent_vs_sequential": rate / sequential_tokens_per_s}


def measure_sink(record: str, n: int = 2000, where: Path | None = None) -> dict:
    """records/s writing `n` copies of one real record line, fsync per record vs per 32, on the disk of
    `where` (default the state dir, where serving's logs live)."""
    from draftwheel.serving.engine.records import parse_record
    from draftwheel.serving.engine.sink import JsonlSink, iter_lines

    def rate(flush_every: int) -> float:
        with tempfile.TemporaryDirectory(dir=where) as tmp:
            sink = JsonlSink(tmp, flush_every=flush_every)
            start = time.perf_counter()
            for _ in range(n):
                sink.write(record)
            sink.close()
            elapsed = time.perf_counter() - start
            assert sum(1 for _, _, line in iter_lines(tmp) if parse_record(line)) == n
            return n / elapsed

    if where is None:
        from draftwheel.home import state_dir

        where = state_dir()
    where.mkdir(parents=True, exist_ok=True)
    each, batched = rate(1), rate(32)
    return {"sink_records_per_s_fsync_each": each, "sink_records_per_s_fsync_32": batched,
            "fsync_batching_speedup": batched / each}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--pair", choices=["reference", "toy"], default="reference")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="repeats per prompt and path (median taken)")
    parser.add_argument("--n-prompts", type=int, default=len(PROMPTS), help="how many of the 8 prompts to run")
    parser.add_argument("--sink-records", type=int, default=2000, help="records per sink measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in the client and in the server")
    add_output_arguments(parser, "serve_http_<pair>")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = str(args.threads)  # inherited by the server process
    import torch

    torch.set_num_threads(args.threads)

    from draftwheel.home import apply_offline_defaults
    from draftwheel.serving.loading import engine_from_specs
    from draftwheel.serving.engine.precision import resolve_dtype
    from draftwheel.serving.server.serve_config import ServeConfig

    apply_offline_defaults()
    prompts = PROMPTS[: args.n_prompts]
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = save_pair(args.pair, Path(tmp))
        serve = ServeConfig()  # the in-process engine decodes as the server does: its dtype and chain cut
        engine = engine_from_specs(target, draft, dtype=resolve_dtype(serve.dtype), min_path_prob=serve.min_path_prob)
        proc, url = start_server(target, draft, Path(tmp, "logs"))
        try:
            load_before = os.getloadavg()[0]
            result = measure_paths(engine, url, prompts, args.max_new_tokens, args.rounds)
            result["load_avg_1m_before_after"] = [load_before, os.getloadavg()[0]]
        finally:
            proc.terminate()
            proc.wait(timeout=60)
        lines = Path(tmp, "logs", "acceptance.jsonl").read_text().splitlines()
    result.update(http_overheads(result.pop("_http_walls"), [json.loads(line) for line in lines]))
    result.update(measure_sink(lines[-1], args.sink_records))
    result["mean_request_latency_s"] = statistics.mean(json.loads(line)["latency_s"] for line in lines)
    result["sink_cost_vs_request_latency"] = 1 / result["sink_records_per_s_fsync_32"] / result["mean_request_latency_s"]
    result.update({"pair": args.pair, "draft": draft.name, "prompts": len(prompts), "rounds": args.rounds,
                   "torch_threads": args.threads,
                   "max_new_tokens": args.max_new_tokens, "server_logged_requests": len(lines)})
    out = save(f"serve_http_{args.pair}", result, args)
    for key, value in result.items():
        print(f"{key:32s} {value:.4g}" if isinstance(value, float) else f"{key:32s} {value}")
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
