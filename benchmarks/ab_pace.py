"""A/B of the hybrid's step-pace settings (serving.adaptive.StepPace) on the reference target, one run.

Why interleaved: on this VM plain decoding's speed moves by ~25 % from one day to the next, so two
separate `draftwheel bench` runs cannot tell a pace change from the day. Here each prompt runs plain
decoding, the draft alone (mode `draft`) and then the hybrid once per setting, back to back, each
setting keeping its own `PaceMemory` across the prompts (as serving keeps one per slice and draft). The suffix index holds only
each request's own prompt and output, as `draftwheel bench --suffix-tier` without logs.

Settings:
- `shipped`: StepPace's defaults;
- `full_k_explore`: explorations at full k, backing off to every 32nd skipped step (before 2026-12-02);
- `never_plain`: the warm-up never ends, so the hybrid drafts whenever the index does not win.

    flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/ab_pace.py --chat \\
        --prompts benchmarks/prompts/chat_heldout.jsonl --out results/ab_pace_chat_heldout.json
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from draftwheel.home import apply_offline_defaults
from serving.adaptive import PaceMemory, StepPace
from serving.bench import read_prompts
from serving.engine import Engine
from serving.params import SamplingParams
from serving.precision import resolve_dtype
from serving.reference import DEFAULT_DRAFT_URI, default_target_dir
from serving.suffix import ReadOnlyIndex, SuffixIndex, target_key

SETTINGS = {
    "shipped": StepPace,
    "full_k_explore": lambda: StepPace(max_explore=32, explore_k=1_000),
    "never_plain": lambda: StepPace(warmup=10**9),
}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=Path, required=True, help="a .jsonl or .txt prompt file")
    parser.add_argument("--chat", action="store_true", help="apply the chat template")
    parser.add_argument("--draft", default=DEFAULT_DRAFT_URI)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--min-path-prob", type=float, default=0.15)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    apply_offline_defaults()
    torch.set_num_threads(args.threads)
    engine = Engine.from_paths(str(default_target_dir()), args.draft, dtype=resolve_dtype("auto"),
                               min_path_prob=args.min_path_prob)
    engine.suffix_index = ReadOnlyIndex(SuffixIndex(target_key(engine.target.model_id)))
    prompts = read_prompts(args.prompts)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, k=args.k)
    engine.generate([prompts[0]], SamplingParams(max_new_tokens=4, k=args.k), slice="warm-up", chat=args.chat,
                    mode="hybrid")
    memories = {name: PaceMemory(factory=factory) for name, factory in SETTINGS.items()}
    tokens, seconds = Counter(), Counter()
    steps: dict[str, Counter] = {name: Counter() for name in SETTINGS}
    identical = Counter()

    def timed(name: str, prompt: Any, mode: str) -> Any:
        """One generation of `prompt` in `mode`, its tokens and seconds counted under `name`."""
        start = time.perf_counter()
        completion, = engine.generate([prompt], params, slice="bench", chat=args.chat, mode=mode)
        seconds[name] += time.perf_counter() - start
        tokens[name] += len(completion.token_ids)
        return completion

    for prompt in tqdm(prompts, desc="ab_pace"):
        plain = timed("plain", prompt, "autoregressive")
        identical["draft"] += timed("draft", prompt, "draft").token_ids == plain.token_ids
        for name, memory in memories.items():
            engine.paces = memory
            hybrid = timed(name, prompt, "hybrid")
            identical[name] += hybrid.token_ids == plain.token_ids
            steps[name].update(step.source or "plain" for step in hybrid.record.steps)
    plain_rate = tokens["plain"] / seconds["plain"]
    result = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "k": args.k,
              "min_path_prob": args.min_path_prob, "torch_threads": torch.get_num_threads(),
              "dtype": str(engine.dtype).removeprefix("torch."), "plain_tokens_per_s": plain_rate,
              "draft_alone": {"tokens_per_s": tokens["draft"] / seconds["draft"],
                              "vs_plain": tokens["draft"] / seconds["draft"] / plain_rate,
                              "greedy_identical": f"{identical['draft']}/{len(prompts)}"}}
    for name in SETTINGS:
        rate = tokens[name] / seconds[name]
        result[name] = {"tokens_per_s": rate, "vs_plain": rate / plain_rate,
                        "vs_draft_alone": rate / result["draft_alone"]["tokens_per_s"],
                        "steps_by_source": dict(steps[name]), "greedy_identical": f"{identical[name]}/{len(prompts)}"}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
