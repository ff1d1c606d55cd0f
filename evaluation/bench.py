"""Side-by-side decoding benchmark: our plain and speculative decoding against HF `generate`.

All methods run in ONE process on the same prompt token ids, interleaved prompt by prompt so that
load changes on a shared machine hit them alike: our autoregressive loop, our speculative loop with the
engine's draft (any kind: `lm` or `eagle3`), HF `generate(do_sample=False)`, HF prompt-lookup decoding
(`prompt_lookup_num_tokens`) and HF `generate(assistant_model=draft, do_sample=False)` with the same k
(constant schedule, no confidence cut-off; needs an `lm` draft: the engine's, or a separate assistant
when the engine serves an eagle3 draft). Greedy only: that is where identity is defined. The result has
the keys of design.md's `bench` table plus the measured draft cost `draft_cost_c`. No I/O besides
reading prompts.

Which weights HF runs: the engine serves CPU models with oneDNN-packed linear layers (draftwheel.serving.engine.prepack),
which HF `generate` does not do. So HF runs on unpacked copies of the engine's models (HF as users run
it: the design.md keys compare our engine with stock HF), and a fifth method, HF assisted generation on
the engine's own models, shows how much of the gain is the kernels (`hf_assisted_same_kernels_tokens_per_s`
and `speedup_vs_hf_assisted_same_kernels`). `engine_kernels` / `hf_kernels` say which kernels ran.
"""

from __future__ import annotations

import contextlib
import copy
import json
import time
from pathlib import Path
from typing import Any, Iterator

import torch

from draftwheel.serving.engine.acceptance import acceptance_rate, draft_cost_ratio, mean_accepted_length
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.precision import dtype_name
from draftwheel.serving.engine.prepack import is_packed, unpacked_copy
from draftwheel.serving.engine.row_invariant import use_stock_attention


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a JSONL file (objects with "prompt", or JSON strings) or a text file (one per line)."""
    lines = [line for line in Path(path).read_text().splitlines() if line.strip()]
    if not lines:
        raise ValueError(f"{path}: no prompts")
    if Path(path).suffix == ".jsonl":
        prompts = []
        for number, line in enumerate(lines, 1):
            item = json.loads(line)
            prompt = item.get("prompt") if isinstance(item, dict) else item
            if not isinstance(prompt, str):
                raise ValueError(f"{path}:{number}: expected a string or an object with a string 'prompt'")
            prompts.append(prompt)
        return prompts
    return [line.replace("\\n", "\n") for line in lines]


@contextlib.contextmanager
def assistant_settings(draft_model: Any, k: int) -> Iterator[None]:
    """HF reads the speculation length from the assistant's generation config: set k, then restore."""
    saved = draft_model.generation_config
    config = copy.deepcopy(saved)
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = "constant"
    config.assistant_confidence_threshold = 0.0
    draft_model.generation_config = config
    try:
        yield
    finally:
        draft_model.generation_config = saved


class _Clock:
    """Wall time and this process's CPU time of a block; CPU time shows the work done even when other
    jobs compete for the cores (wall time is what design.md's tokens/s use)."""

    def __enter__(self) -> "_Clock":
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def _hf_generate(model: Any, ids: list[int], max_new_tokens: int, assistant: Any = None, lookup: int = 0):
    """HF greedy generate: plain, assisted (`assistant`), or prompt-lookup (`lookup` tokens per guess)."""
    input_ids = torch.tensor([ids])
    extra = {"prompt_lookup_num_tokens": lookup} if lookup else {"assistant_model": assistant}
    with _Clock() as clock, torch.inference_mode():
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                             max_new_tokens=max_new_tokens, **extra)
    return out[0, len(ids):].tolist(), clock


def _ours(engine: Engine, prompt: Any, params: SamplingParams, chat: bool, mode: str):
    with _Clock() as clock:
        completion, = engine.generate([prompt], params, slice="bench", chat=chat, mode=mode)
    return completion, clock


def _kernels(model: Any) -> str:
    return "oneDNN prepacked" if is_packed(model) else "stock"


def _spec_mode(engine: Engine) -> str:
    """The engine's speculative mode: its draft (any kind; hybrid when it has a suffix index), else its
    Medusa heads."""
    if engine.draft is None and engine.medusa is None:
        raise ValueError("bench needs a draft model or Medusa heads")
    if engine.draft is None:
        return "medusa"
    return "hybrid" if engine.suffix_index is not None else "draft"


def _kind(engine: Engine) -> str:
    return engine.draft.kind if engine.draft is not None else "medusa"


def stock_copy(model: Any) -> Any:
    """A copy of an engine model as HF runs it: unpacked linear layers, transformers' own attention."""
    copy_ = unpacked_copy(model)
    use_stock_attention(copy_)
    return copy_


def _hf_methods(engine: Engine, assistant: Any, lookup: int) -> dict[str, tuple[Any, Any, int]]:
    """HF baselines: name -> (model, assistant, prompt-lookup tokens). HF runs stock copies (`stock_copy`);
    with an `lm` draft it also runs on the engine's own packed models ("same kernels")."""
    hf_target = stock_copy(engine.target.model)
    methods = {"hf_plain": (hf_target, None, 0), "hf_prompt_lookup": (hf_target, None, lookup)}
    if engine.draft is not None and engine.draft.kind == "lm":
        assistant = engine.draft.model
        methods["hf_assisted_same_kernels"] = (engine.target.model, assistant, 0)
    if assistant is not None:
        methods["hf_assisted"] = (hf_target, stock_copy(assistant), 0)
    if engine.dtype != torch.float32:  # the target alone as most users run it: float32, stock HF
        methods["hf_plain_float32"] = (copy.deepcopy(hf_target).float(), None, 0)
    return methods


def run_bench(engine: Engine, prompts: list[Any], max_new_tokens: int, k: int = 4, chat: bool = False,
              progress: bool = True, cpu_time: bool = False, assistant: Any = None,
              prompt_lookup_tokens: int = 10) -> dict[str, Any]:
    """Measure ours (plain, speculative with the engine's draft of any kind) and HF generate (plain,
    prompt lookup, assisted) on `prompts`; return the design.md `bench` keys plus `draft_cost_c` (the
    measured per-drafted-token cost over a verification forward), the kernel and same-kernels keys, and
    `cpu_*` rates when `cpu_time`. HF assisted needs an `lm` draft: the engine's own, or `assistant`
    (a causal LM sharing the tokenizer, e.g. the small-LM v0 when the engine serves an eagle3 draft)."""
    mode = _spec_mode(engine)
    from tqdm import tqdm

    methods = _hf_methods(engine, assistant, prompt_lookup_tokens)
    params = SamplingParams(max_new_tokens=max_new_tokens, k=k)
    tokens = dict.fromkeys(("plain", "spec", *methods), 0)
    seconds = dict.fromkeys(tokens, 0.0)
    cpu_seconds = dict.fromkeys(tokens, 0.0)
    drafted = accepted = steps = identical = identical_plain = 0
    draft_s = verify_s = 0.0
    with contextlib.ExitStack() as stack:
        for _, helper, _ in methods.values():
            if helper is not None:
                stack.enter_context(assistant_settings(helper, k))
        # Warm-up (allocator, first-call paths) outside the timed region.
        _ours(engine, prompts[0], SamplingParams(max_new_tokens=4, k=k), chat, mode)
        for model, helper, lookup in methods.values():
            _hf_generate(model, engine.encode(prompts[0], chat)[1], 4, helper, lookup)
        for prompt in tqdm(prompts, desc="bench", disable=not progress):
            plain, clock_plain = _ours(engine, prompt, params, chat, "autoregressive")
            spec, clock_spec = _ours(engine, prompt, params, chat, mode)
            runs = [("plain", plain.token_ids, clock_plain), ("spec", spec.token_ids, clock_spec)]
            outputs = {}
            for name, (model, helper, lookup) in methods.items():
                ids, clock = _hf_generate(model, spec.prompt_token_ids, max_new_tokens, helper, lookup)
                outputs[name] = ids
                runs.append((name, ids, clock))
            for name, ids, clock in runs:
                tokens[name] += len(ids)
                seconds[name] += clock.wall
                cpu_seconds[name] += clock.cpu
            drafted += spec.record.drafted_tokens
            accepted += spec.record.accepted_tokens
            steps += spec.record.verify_steps
            draft_s += spec.stats.draft_s
            verify_s += spec.stats.verify_s
            identical += int(spec.token_ids == outputs["hf_plain"])
            identical_plain += int(spec.token_ids == plain.token_ids)  # the engine's own lossless claim
    rate = {name: tokens[name] / seconds[name] for name in tokens}
    result = {
        "plain_tokens_per_s": rate["plain"], "spec_tokens_per_s": rate["spec"],
        "hf_plain_tokens_per_s": rate["hf_plain"], "hf_assisted_tokens_per_s": rate.get("hf_assisted"),
        "hf_prompt_lookup_tokens_per_s": rate["hf_prompt_lookup"],
        "speedup_vs_plain": rate["spec"] / rate["plain"],
        "speedup_vs_hf_assisted": rate["spec"] / rate["hf_assisted"] if "hf_assisted" in rate else None,
        "speedup_vs_hf_prompt_lookup": rate["spec"] / rate["hf_prompt_lookup"],
        "acceptance_rate": acceptance_rate(accepted, drafted),
        "mean_accepted_length": mean_accepted_length(accepted, steps),
        "greedy_identical": f"{identical}/{len(prompts)}",  # vs HF plain in the engine's dtype
        "greedy_identical_vs_plain": f"{identical_plain}/{len(prompts)}",
        "k": k, "prompts": len(prompts), "max_new_tokens": max_new_tokens,
        "draft_kind": _kind(engine), "mode": mode, "prompt_lookup_num_tokens": prompt_lookup_tokens,
        "draft_cost_c": draft_cost_ratio(draft_s, drafted, verify_s, steps),
        "engine_kernels": _kernels(engine.target.model), "hf_kernels": _kernels(methods["hf_plain"][0]),
        "dtype": dtype_name(engine.dtype),
    }
    if "hf_plain_float32" in rate:
        result["hf_plain_float32_tokens_per_s"] = rate["hf_plain_float32"]
        result["speedup_vs_hf_plain_float32"] = rate["spec"] / rate["hf_plain_float32"]
    if "hf_assisted_same_kernels" in rate:
        result["hf_assisted_same_kernels_tokens_per_s"] = rate["hf_assisted_same_kernels"]
        result["speedup_vs_hf_assisted_same_kernels"] = rate["spec"] / rate["hf_assisted_same_kernels"]
    if cpu_time:
        cpu_rate = {name: tokens[name] / cpu_seconds[name] for name in tokens}
        result.update({f"cpu_{name}_tokens_per_s": value for name, value in cpu_rate.items()})
        result["cpu_speedup_vs_plain"] = cpu_rate["spec"] / cpu_rate["plain"]
        if "hf_assisted" in cpu_rate:
            result["cpu_speedup_vs_hf_assisted"] = cpu_rate["spec"] / cpu_rate["hf_assisted"]
    return result


def run_sampled_bench(engine: Engine, prompts: list[Any], max_new_tokens: int, k: int = 4, chat: bool = False,
                      temperature: float = 0.7, progress: bool = True) -> dict[str, Any]:
    """Sampling speed: our plain vs speculative decoding at `temperature`, same prompts and seeds, in one
    run (interleaved). Outputs differ between the two by design (rejection sampling is exact in law,
    not per sample: tests/serving check the law with a chi-square test), so no identity is counted."""
    from tqdm import tqdm

    tokens = {"plain": 0, "spec": 0}
    seconds = {"plain": 0.0, "spec": 0.0}
    drafted = accepted = steps = 0
    spec_mode = _spec_mode(engine)
    warm = SamplingParams(max_new_tokens=4, k=k, temperature=temperature, seed=0)
    _ours(engine, prompts[0], warm, chat, spec_mode)
    for seed, prompt in enumerate(tqdm(prompts, desc="bench sampled", disable=not progress)):
        params = SamplingParams(max_new_tokens=max_new_tokens, k=k, temperature=temperature, seed=seed)
        for name, mode in (("plain", "autoregressive"), ("spec", spec_mode)):
            completion, clock = _ours(engine, prompt, params, chat, mode)
            tokens[name] += len(completion.token_ids)
            seconds[name] += clock.wall
            if name == "spec":
                drafted += completion.record.drafted_tokens
                accepted += completion.record.accepted_tokens
                steps += completion.record.verify_steps
    rate = {name: tokens[name] / seconds[name] for name in tokens}
    return {"temperature": temperature, "plain_tokens_per_s": rate["plain"], "spec_tokens_per_s": rate["spec"],
            "speedup_vs_plain": rate["spec"] / rate["plain"],
            "acceptance_rate": acceptance_rate(accepted, drafted),
            "mean_accepted_length": mean_accepted_length(accepted, steps),
            "k": k, "prompts": len(prompts), "max_new_tokens": max_new_tokens, "draft_kind": _kind(engine),
            "mode": spec_mode}

