"""Serving under load: output tokens/s, TTFT and TPOT of `draftwheel serve` at several concurrencies, one run.

Each server setting is `draftwheel serve` started in its own process (a fresh log dir, so a fresh suffix
index): `serial` (one request at a time, plain decoding: also the reference for greedy identity),
`batched-plain` (continuous batching, plain decoding) and, with `--draft`, `serial-hybrid` (one at a
time, hybrid speculative decoding: the default server before continuous batching was) and
`batched-hybrid` (continuous batching, hybrid: the default server). At each concurrency C (`--concurrency`) C client threads stream greedy chat completions with the
official `openai` client, one request after another, until `--requests` are done (a closed loop). At
each rate R (`--rates`) requests arrive as a Poisson process of R per second, each on its own client
thread however many are still running (an open loop: the queue grows when the server cannot keep up).
The prompts mix chat, code and templated (SQL, tool calls) requests (draftwheel.mining.workloads); each
level has its own seeded prompts, and every setting gets the same ones in the same order.

Per setting and concurrency: output tokens/s over the wall clock of the whole level; TTFT (to the first
content chunk) and TPOT ((last chunk - first) / (tokens - 1)) p50/p99 on the client; each setting's
speed against `serial` at the same concurrency. Greedy identity: each setting's outputs against `serial`'s
(one at a time, plain: batch-1 plain decoding), token by token from the servers' acceptance logs; at each
divergence the target's logit margin between the two tokens at the first differing position, as plain
decoding computes it (a margin near the rounding step of the serving dtype: float summation order).
With `--prefix-burst N`: a burst of N concurrent requests sharing a long system prompt (`--system-words`),
one token each, against batched servers with `prefix_caching` off and on (the system prompt served once
before): the burst's wall time, i.e. how fast its prompts are read, and the ratio.

    .venv/bin/python benchmarks/bench_load.py --draft models:/draftwheel-draft@champion
    .venv/bin/python benchmarks/bench_load.py --settings serial batched-plain --concurrency 1 4 16 32 --rates 1 2

The target defaults to the reference target (SmolLM2-135M-Instruct, converted offline into the state dir).
The JSON goes to --out (default $DRAFTWHEEL_HOME/benchmarks/bench_load.json) and the run to MLflow.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_io import add_output_arguments, save  # benchmarks/ is on sys.path when run as a script

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = {  # name -> the `draftwheel serve` overrides it runs with
    "serial": ["scheduler=serial", "mode=autoregressive"],
    "batched-plain": ["scheduler=batched", "mode=autoregressive"],
    "serial-hybrid": ["scheduler=serial", "mode=hybrid"],
    "batched-hybrid": ["scheduler=batched", "mode=hybrid"],
}
NEEDS_DRAFT = ("serial-hybrid", "batched-hybrid")


def mixed_prompts(n: int, seed: int) -> list[str]:
    """n prompts, chat, code and templated in turn."""
    from draftwheel.mining.workloads import build_workload

    parts = [build_workload(name, -(-n // 3), seed) for name in ("chat", "code", "templated")]
    return [item["prompt"] for group in zip(*parts) for item in group][:n]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def _client(url: str):
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)
    return client, client.models.list().data[0].id


def stream_one(client, model: str, prompt: str | list, max_tokens: int) -> dict[str, Any]:
    """One greedy streamed chat completion (a prompt: a user message, or a list of messages): TTFT, TPOT,
    tokens and text as the client saw them."""
    start = time.perf_counter()
    first = last = None
    tokens, text = 0, []
    for chunk in client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt,
            max_tokens=max_tokens, temperature=0, stream=True, stream_options={"include_usage": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
            text.append(chunk.choices[0].delta.content)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return {"ttft_s": (first or time.perf_counter()) - start,
            "tpot_s": (last - first) / (tokens - 1) if first and tokens > 1 else None,
            "tokens": tokens, "text": "".join(text)}


def summarise(requests: list[dict[str, Any]], errors: list[str], wall: float) -> dict[str, Any]:
    ttft = [r["ttft_s"] for r in requests]
    tpot = [r["tpot_s"] for r in requests if r["tpot_s"] is not None]
    tokens = sum(r["tokens"] for r in requests)
    return {"completed": len(requests), "errors": errors, "wall_s": wall,
            "output_tokens": tokens, "output_tokens_per_s": tokens / wall,
            "ttft_p50_s": percentile(ttft, 50), "ttft_p99_s": percentile(ttft, 99),
            "tpot_p50_s": percentile(tpot, 50), "tpot_p99_s": percentile(tpot, 99),
            "texts": {r["index"]: r["text"] for r in requests}}


def run_level(url: str, prompts: list, concurrency: int, max_tokens: int) -> dict[str, Any]:
    """Closed loop: `concurrency` client threads stream the prompts' greedy chat completions, each thread
    one request after another; the level's figures."""
    client, model = _client(url)
    todo, lock = list(enumerate(prompts)), threading.Lock()
    requests: list[dict[str, Any]] = []
    errors: list[str] = []

    def worker() -> None:
        while True:
            with lock:
                if not todo:
                    return
                index, prompt = todo.pop(0)
            try:
                requests.append({"index": index, **stream_one(client, model, prompt, max_tokens)})
            except Exception as exc:  # noqa: BLE001 - counted, the level goes on
                errors.append(f"{type(exc).__name__}: {exc}")

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return {"concurrency": concurrency, **summarise(requests, errors, time.perf_counter() - start)}


def run_poisson(url: str, prompts: list, rate: float, max_tokens: int, seed: int) -> dict[str, Any]:
    """Open loop: requests arrive as a Poisson process of `rate` per second (exponential gaps drawn
    from `seed`), each on its own thread however many are still running; the level's figures."""
    import random

    client, model = _client(url)
    gaps = random.Random(seed)
    requests: list[dict[str, Any]] = []
    errors: list[str] = []

    def one(index: int, prompt: str | list) -> None:
        try:
            requests.append({"index": index, **stream_one(client, model, prompt, max_tokens)})
        except Exception as exc:  # noqa: BLE001 - counted, the level goes on
            errors.append(f"{type(exc).__name__}: {exc}")

    start = time.perf_counter()
    threads, due = [], 0.0
    for index, prompt in enumerate(prompts):
        due += gaps.expovariate(rate)
        time.sleep(max(0.0, start + due - time.perf_counter()))
        threads.append(threading.Thread(target=one, args=(index, prompt)))
        threads[-1].start()
    for thread in threads:
        thread.join()
    return {"rate_per_s": rate, **summarise(requests, errors, time.perf_counter() - start)}


def start_server(target: str, draft: str | None, log_dir: Path, overrides: list[str]) -> tuple[subprocess.Popen, str]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    command = [sys.executable, "-m", "draftwheel.flows.commands", "serve", "--target", target,
               "--port", str(port), "--log-dir", str(log_dir)]
    command += ["--draft", draft] if draft else ["--no-draft"]
    for override in overrides:
        command += ["--set", override]
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import httpx

    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while True:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"draftwheel serve did not come up ({' '.join(overrides)})")
        try:
            httpx.get(url + "/healthz")
            return proc, url
        except httpx.TransportError:
            time.sleep(0.5)


SYSTEM = ("You are the support assistant of a hardware store. Answer in two sentences, politely, without "
          "promising delivery dates, refunds or discounts; point to the returns desk for anything else. ")


def burst_messages(n: int, words: int) -> list[list[dict[str, str]]]:
    """n chats sharing one system prompt of about `words` words, each with its own question."""
    system = " ".join((SYSTEM * (words // len(SYSTEM.split()) + 1)).split()[:words])
    return [[{"role": "system", "content": system}, {"role": "user", "content": f"Question {i}: do you sell "
             f"item number {1000 + 7 * i}?"}] for i in range(n)]


def prefix_burst(target: str, n: int, words: int, work: Path, overrides: list[str]) -> dict[str, Any]:
    """The burst's wall time with prefix caching off and on (module docstring)."""
    result: dict[str, Any] = {"requests": n}
    messages = burst_messages(n + 1, words)
    for caching in (False, True):
        proc, url = start_server(target, None, work / f"burst-{caching}", ["scheduler=batched", "mode=autoregressive",
                                 f"prefix_caching={str(caching).lower()}", f"max_batch={max(n, 1)}"] + overrides)
        try:
            run_level(url, messages[-1:], 1, 1)  # the system prompt, served once before
            level = run_level(url, messages[:n], n, 1)
        finally:
            proc.terminate()
            proc.wait(timeout=120)
        key = "prefix_caching" if caching else "no_prefix_caching"
        result[key] = {"wall_s": level["wall_s"], "ttft_p50_s": level["ttft_p50_s"], "ttft_p99_s": level["ttft_p99_s"],
                       "completed": level["completed"]}
    records = logged_outputs(work / "burst-True")
    result["prompt_tokens"] = max(len(r["prompt_token_ids"]) for r in records.values())
    result["speedup"] = result["no_prefix_caching"]["wall_s"] / result["prefix_caching"]["wall_s"]
    return result


def logged_outputs(log_dir: Path) -> dict[str, dict[str, Any]]:
    """prompt text (as fed, chat template applied) -> its record's prompt and output token ids."""
    from draftwheel.serving.engine.sink import iter_lines

    return {record["prompt"]: record for record in (json.loads(line) for *_, line in iter_lines(log_dir))}


def greedy_identity(reference: dict[str, dict], outputs: dict[str, dict], target: Any = None) -> dict[str, Any]:
    """Outputs equal to the reference's, token for token; each divergence's first position, and with the
    `target` (a LoadedModel as served) the reference token's logit margin over the other there."""
    from draftwheel.evaluation.greedy_check import logit_margin
    from draftwheel.serving.engine.acceptance import common_prefix

    same, divergences = 0, []
    for prompt, record in outputs.items():
        want, got = reference[prompt]["output_token_ids"], record["output_token_ids"]
        if got == want:
            same += 1
            continue
        position = common_prefix(want, got)
        divergence = {"position": position, "tokens": len(want)}
        if target is not None and position < min(len(want), len(got)):
            divergence["logit_margin"] = logit_margin(target.model, record["prompt_token_ids"], want, position,
                                                      got[position])
        divergences.append(divergence)
    return {"identical": f"{same}/{len(outputs)}", "divergences": divergences}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--target", default=None, help="model dir or hub id (default: the reference target)")
    parser.add_argument("--draft", default=None, help="draft for the hybrid settings (dir or models:/ URI)")
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=None,
                        help="default: serial, batched-plain, and the hybrid two with --draft")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--rates", type=float, nargs="*", default=[0.5, 1.0],
                        help="Poisson arrival rates, requests per second (open loop)")
    parser.add_argument("--requests", type=int, default=32, help="requests per concurrency level or rate")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="a `draftwheel serve` override for every setting, e.g. --set max_batch=32")
    parser.add_argument("--no-margins", action="store_true", help="skip loading the target to measure logit margins")
    parser.add_argument("--prefix-burst", type=int, default=16, help="burst size sharing a system prompt (0: skip)")
    parser.add_argument("--system-words", type=int, default=300, help="words of the burst's shared system prompt")
    add_output_arguments(parser, "bench_load")
    args = parser.parse_args(argv)
    if args.settings is None:
        args.settings = [s for s in SETTINGS if args.draft or s not in NEEDS_DRAFT]
    if not args.draft and any(s in NEEDS_DRAFT for s in args.settings):
        parser.error("--draft: the hybrid settings need a draft")
    return args


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from draftwheel.home import apply_offline_defaults, models_dir
    from draftwheel.serving.engine.records import describe_shares, record_from_dict, source_counts, source_shares

    apply_offline_defaults()
    if args.target is None:
        from draftwheel.serving.engine.reference import ensure_reference_target

        args.target = str(ensure_reference_target(models_dir()))
    # each level's key in the result: "C" for a closed loop of C clients, "rate=R" for Poisson arrivals
    levels = {str(c): (functools.partial(run_level, concurrency=c), mixed_prompts(args.requests, seed=c))
              for c in args.concurrency}
    levels |= {f"rate={r:g}": (functools.partial(run_poisson, rate=r, seed=int(r * 1000)),
                               mixed_prompts(args.requests, seed=1000 + i)) for i, r in enumerate(args.rates)}
    result: dict[str, Any] = {"cpu": cpu_name(), "cores": os.cpu_count(), "target": args.target, "draft": args.draft,
                              "requests": args.requests, "max_tokens": args.max_tokens, "settings": {}}
    logs: dict[str, dict[str, dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for setting in args.settings:
            log_dir = Path(tmp, setting)
            proc, url = start_server(args.target, args.draft if setting in NEEDS_DRAFT else None, log_dir,
                                     SETTINGS[setting] + ["default_temperature=0"] + args.overrides)
            try:
                run_level(url, mixed_prompts(2, seed=-1), 1, 8)  # warm-up, also outside the index's reach
                figures = {}
                for key, (run, prompts) in levels.items():
                    figures[key] = run(url, prompts, max_tokens=args.max_tokens)
                    figures[key].pop("texts")
                    print(f"{setting:15s} {key:9s} {figures[key]['output_tokens_per_s']:7.1f} tok/s  "
                          f"TTFT p50/p99 {figures[key]['ttft_p50_s']:.2f}/{figures[key]['ttft_p99_s']:.2f} s  "
                          f"TPOT p50 {figures[key]['tpot_p50_s'] or 0:.3f} s", flush=True)
            finally:
                proc.terminate()
                proc.wait(timeout=120)
            logs[setting] = logged_outputs(log_dir)
            sources = source_shares(source_counts(record_from_dict(r) for r in logs[setting].values()))
            result["settings"][setting] = {"overrides": SETTINGS[setting] + args.overrides, "levels": figures,
                                           "steps_by_source": sources}
            if sources:  # plain decoding logs no steps
                print(f"{setting:15s} steps by source (share x tokens a step): {describe_shares(sources)}", flush=True)
        if args.prefix_burst:
            result["prefix_burst"] = prefix_burst(args.target, args.prefix_burst, args.system_words, Path(tmp),
                                                  ["default_temperature=0"] + args.overrides)
            print(f"prefix burst   {json.dumps(result['prefix_burst'])}", flush=True)
    if "serial" in result["settings"]:
        target = None
        if not args.no_margins:
            from draftwheel.serving.engine.engine import Engine
            from draftwheel.serving.engine.precision import resolve_dtype
            from draftwheel.serving.loading import load_model
            from draftwheel.serving.server.serve_config import ServeConfig

            target = Engine(load_model(args.target), dtype=resolve_dtype(ServeConfig().dtype)).target  # as served
        for setting, figures in result["settings"].items():
            for c, level in figures["levels"].items():
                level["speed_vs_serial"] = (level["output_tokens_per_s"]
                                            / result["settings"]["serial"]["levels"][c]["output_tokens_per_s"])
            if setting != "serial":
                figures["greedy_identity_vs_serial"] = greedy_identity(logs["serial"], logs[setting], target)
    out = save("bench_load", result, args)
    print(json.dumps({s: {c: round(v["output_tokens_per_s"], 1) for c, v in f["levels"].items()}
                      for s, f in result["settings"].items()}))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
