"""Does one distillation round on shifted traffic raise acceptance on that slice? (the `lm` draft kind)

On the reference target (SmolLM2-135M-Instruct) and a small-LM v0 draft (the target's first two layers
with its embeddings and head, bootstrapped by `draftwheel.training.bootstrap` with `--boot`'s settings into its own
model dir and not registered, so the state dir's champion is untouched), in one run:
1. v0 acceptance rate and mean accepted length (k=4, greedy, through `draftwheel.serving.engine.engine.Engine`) on a
   `chat` hold-out and a `code` hold-out (prompts disjoint from any training prompts);
2. code traffic: the target's greedy completions of `code` workload prompts (top-k log-probs kept);
3. teacher-mode timing: a few identical steps with the teacher online, cached from generation, and
   cached by a forward pass (training tokens/s of each);
4. one distillation round of v0 on that code traffic (configs/distill.yaml + overrides), timed;
5. the candidate's acceptance on the same `code` and `chat` hold-outs.
Prints the figures as ratios measured in this run.

    .venv/bin/python benchmarks/bench_distill.py [distill overrides, e.g. loss=tvd]
The JSON goes to --out (default $DRAFTWHEEL_HOME/benchmarks/bench_distill.json) and the run to MLflow;
the v0, the traffic and the candidate stay under $DRAFTWHEEL_HOME.
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

from bench_io import add_output_arguments, save

ROOT = Path(__file__).resolve().parents[1]
# The small-LM v0 this benchmark distils (configs/bootstrap.yaml's eagle3 v0 is trained by `train eagle`).
V0_LM = ["draft_kind=lm", "draft_name=bench-distill-v0-lm", "n_prompts=24", "max_new_tokens=48", "epochs=8",
         "register=false"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--chat-holdout", type=int, default=10, help="chat hold-out prompts")
    parser.add_argument("--code-holdout", type=int, default=10, help="code hold-out prompts")
    parser.add_argument("--code-train", type=int, default=48, help="code prompts whose target completions train")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="tokens per completion (train and eval)")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per verification step")
    parser.add_argument("--timing-steps", type=int, default=4, help="steps per teacher-mode timing run (0 = skip)")
    parser.add_argument("--config", default=str(ROOT / "configs" / "distill.yaml"), help="distillation config")
    parser.add_argument("overrides", nargs="*", help="distill config overrides, key=value")
    parser.add_argument("--boot", action="append", default=[], metavar="KEY=VALUE",
                        help="v0 bootstrap override (repeatable), after the small-LM v0's own: "
                             + " ".join(V0_LM) + "; e.g. target=DIR for another target")
    add_output_arguments(parser, "bench_distill")
    return parser.parse_args(argv)


def engine_acceptance(engine, prompts: list[dict], k: int, max_new_tokens: int) -> tuple[dict, list]:
    """Greedy speculative decoding of `prompts`; totals over all requests, vLLM's definitions."""
    from draftwheel.serving.engine.acceptance import acceptance_rate, mean_accepted_length
    from draftwheel.serving.engine.params import SamplingParams

    params = SamplingParams(max_new_tokens=max_new_tokens, k=k)
    started = time.perf_counter()
    completions = [engine.generate([p["prompt"]], params, slice=p["slice"], chat=True)[0] for p in prompts]
    elapsed = time.perf_counter() - started
    accepted = sum(c.record.accepted_tokens for c in completions)
    drafted = sum(c.record.drafted_tokens for c in completions)
    steps = sum(c.record.verify_steps for c in completions)
    generated = sum(len(c.token_ids) for c in completions)
    figures = {"acceptance_rate": acceptance_rate(accepted, drafted),
               "mean_accepted_length": mean_accepted_length(accepted, steps),
               "requests": len(completions), "generated_tokens": generated, "tokens_per_s": generated / elapsed}
    return figures, completions


def holdout_from_completions(completions: list, path: Path) -> Path:
    """The Engine's (lossless, i.e. the target's greedy) outputs as a holdout/ dataset."""
    from draftwheel.training.target_completions import save_rows

    rows = [{"request_id": c.request_id, "prompt": c.prompt, "prompt_token_ids": c.prompt_token_ids,
             "slice": c.record.slice, "max_new_tokens": len(c.token_ids), "output_token_ids": c.token_ids}
            for c in completions if c.token_ids]
    return save_rows(rows, path)


def time_teacher_modes(args, base: list[str], distill_dir: Path, work: Path) -> dict:
    """Training tokens/s for the same few steps with each teacher source."""
    from datasets import load_from_disk

    from draftwheel.config import load_config
    from draftwheel.training.distill import DistillConfig, train_distill

    plain = work / "timing" / "plain" / "distill"
    load_from_disk(str(distill_dir)).remove_columns(["teacher_topk_values", "teacher_topk_indices"]).save_to_disk(str(plain))
    runs = {"online": ("online", distill_dir), "cached_from_generation": ("cached", distill_dir),
            "cached_by_forward": ("cached", plain)}
    results = {}
    for name, (mode, data) in runs.items():
        overrides = base + [f"teacher_mode={mode}", f"dataset={data}", "holdout=", f"max_steps={args.timing_steps}",
                            f"output_dir={work / 'timing' / name}", "tracking=false"]
        started = time.perf_counter()
        out = train_distill(load_config(DistillConfig, args.config, overrides))
        metrics = json.loads((out / "draftwheel_training.json").read_text())["metrics"]
        results[name] = {"train_tokens_per_s": metrics["train_tokens_per_s"], "cache_build_s": metrics["teacher_cache_s"],
                         "wall_s": time.perf_counter() - started}
        print(f"timing {name}: {results[name]}", flush=True)
    return results


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    from draftwheel import home
    from draftwheel.config import load_config
    from draftwheel.mining.workloads import build_workload
    from draftwheel.serving.engine.engine import Engine
    from draftwheel.serving.loading import load_model
    from draftwheel.training.bootstrap import BootstrapConfig, bootstrap
    from draftwheel.training.distill import DistillConfig, train_distill
    from draftwheel.training.target_completions import save_traffic, target_traffic

    home.apply_offline_defaults()
    boot_config = load_config(BootstrapConfig, ROOT / "configs" / "bootstrap.yaml", [*V0_LM, *args.boot])
    boot = bootstrap(boot_config)
    target = load_model(boot["target_dir"])
    v0 = load_model(boot["draft_dir"])
    engine = Engine(target, v0)
    work = home.state_dir() / "bench_distill"
    shutil.rmtree(work, ignore_errors=True)
    used_chat = boot_config.n_prompts + boot_config.holdout_prompts  # prompts the v0 saw (train + its eval)
    chat = build_workload("chat", used_chat + args.chat_holdout, boot_config.seed)[used_chat:]
    code = build_workload("code", args.code_train + args.code_holdout, seed=0)
    code_train, code_holdout = code[: args.code_train], code[args.code_train:]

    report: dict = {"target": boot["target_dir"], "v0_draft": boot["draft_dir"], "k": args.k,
                    "max_new_tokens": args.max_new_tokens}
    print("== v0 on chat and code hold-outs", flush=True)
    report["v0_chat"], _ = engine_acceptance(engine, chat, args.k, args.max_new_tokens)
    report["v0_code"], code_done = engine_acceptance(engine, code_holdout, args.k, args.max_new_tokens)
    print(json.dumps({"v0_chat": report["v0_chat"], "v0_code": report["v0_code"]}), flush=True)
    holdout_dir = holdout_from_completions(code_done, work / "code_holdout")

    # Training data is kept between runs (it is input, not a measurement); everything measured is redone.
    traffic_dir = (home.state_dir() / "bench_distill_traffic"
                   / f"code-{args.code_train}-{args.max_new_tokens}-{(target.model_id.sha256 or 'unhashed')[:12]}")
    distill_dir = traffic_dir / "distill"
    report["traffic_reused"] = distill_dir.is_dir()
    if not report["traffic_reused"]:
        print(f"== code traffic: target completions of {len(code_train)} prompts", flush=True)
        started = time.perf_counter()
        rows = target_traffic(target.model, target.tokenizer, code_train, args.max_new_tokens, top_k=64)
        report["traffic_s"] = time.perf_counter() - started
        save_traffic(rows, [], traffic_dir)

    base = [f"student={boot['draft_dir']}", f"target={boot['target_dir']}", *args.overrides]
    if args.timing_steps:
        report["teacher_modes"] = time_teacher_modes(args, base, distill_dir, work)

    print("== one distillation round on code traffic", flush=True)
    config = load_config(DistillConfig, args.config, base + [f"dataset={distill_dir}", f"holdout={holdout_dir}",
                                                              f"output_dir={work / 'candidate'}"])
    started = time.perf_counter()
    candidate = train_distill(config)
    report["train_wall_s"] = time.perf_counter() - started
    info = json.loads((candidate / "draftwheel_training.json").read_text())
    report["train"] = {k: info["metrics"][k] for k in ("train_tokens", "train_tokens_per_s", "train_runtime_s", "steps")}
    report["train_eval_history"] = info["eval_history"]
    report["distill_config"] = info["config"]

    engine.swap_draft(load_model(candidate))
    print("== candidate on the same hold-outs", flush=True)
    report["after_code"], _ = engine_acceptance(engine, code_holdout, args.k, args.max_new_tokens)
    report["after_chat"], _ = engine_acceptance(engine, chat, args.k, args.max_new_tokens)
    before, after = report["v0_code"]["mean_accepted_length"], report["after_code"]["mean_accepted_length"]
    report["code_mean_accepted_length_gain"] = after / before - 1.0
    report["chat_mean_accepted_length_change"] = (report["after_chat"]["mean_accepted_length"]
                                                  / report["v0_chat"]["mean_accepted_length"] - 1.0)
    report["goal_met"] = report["code_mean_accepted_length_gain"] >= 0.30 and report["train_wall_s"] < 20 * 60
    out = save("bench_distill", report, args)
    print(f"v0 chat: acceptance {report['v0_chat']['acceptance_rate']:.3f}, "
          f"mean accepted length {report['v0_chat']['mean_accepted_length']:.3f} (k={args.k})")
    print(f"code mean accepted length: {before:.3f} -> {after:.3f} "
          f"({report['code_mean_accepted_length_gain']:+.1%}); acceptance "
          f"{report['v0_code']['acceptance_rate']:.3f} -> {report['after_code']['acceptance_rate']:.3f}")
    print(f"chat mean accepted length after: {report['after_chat']['mean_accepted_length']:.3f} "
          f"({report['chat_mean_accepted_length_change']:+.1%})")
    print(f"training: {report['train_wall_s']:.0f} s wall, {report['train']['train_tokens_per_s']:.0f} tokens/s; "
          f"goal met: {report['goal_met']}; wrote {out}")
    return report


if __name__ == "__main__":
    main()
