"""`draftwheel demo`: the whole loop on the embedded defaults, ending in a before/after table.

bootstrap (if there is no champion) -> serve `chat` traffic -> the monitor sees nothing wrong -> traffic
shifts to `code` -> the monitor sees acceptance fall and runs the flywheel (mine -> train -> shadow ->
promote) -> the new champion serves code traffic -> plain decoding, the old and the new champion on
held-out chat and code prompts, interleaved prompt by prompt so machine load cannot favour either. The
table (acceptance rate, mean accepted length, tokens/s, speedup vs plain decoding, per slice) is
printed and saved (JSON, markdown, PNG), logged to MLflow and kept as Prefect artifacts of the flow run.

Served traffic, evaluation prompts and the prompts bootstrap trained the v0 draft on are pairwise
disjoint, so no figure is measured on a prompt some draft was trained on. The plain-decoding baseline
is shared by both columns (it does not depend on the draft). Everything runs on CPU, Prefect's temporary
server and MLflow sqlite in the state dir; sizes come from `DemoConfig`.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefect import flow

from draftwheel import home
from draftwheel.config import load_config, to_dict
from draftwheel.registry_names import CHAMPION_URI
from draftwheel.flows import artifacts, report
from draftwheel.flows.flywheel import FlywheelConfig, override
from draftwheel.serving.engine.precision import check_dtype_name

SLICES = ("chat", "code")
STEPS = 7


@dataclass
class DemoConfig:
    """Sizes and thresholds of the demo (configs/demo.yaml mirrors these defaults)."""

    chat_requests: int = 16
    """Chat requests served before the shift."""
    code_requests: int = 48
    """Code requests served after the shift (the flywheel's training material)."""
    after_requests: int = 8
    """Code requests served by the new champion at the end (0 = skip)."""
    eval_requests: int = 8
    """Held-out prompts per slice for the before/after table (never served to the logs)."""
    max_new_tokens: int = 40
    """Per request. The code the round trains on is continued to configs/eagle.yaml's continue_to (192)
    tokens anyway, so shorter requests cost the round little data and save every serving phase time."""
    k: int = 5
    """Draft tokens per verification step (at most, with min_path_prob)."""
    min_path_prob: float = 0.15
    """eagle3: stop a chain once the draft's own probability of it falls below this (0 = always k)."""
    suffix_tier: bool = True
    """Serve the traffic as `draftwheel serve` does by default (mode hybrid: each step drafts from an index of
    earlier requests and the request itself when that promises more than the draft), and measure both
    champions that way too, beside each draft alone."""
    max_batch: int = 4
    """The served traffic is queued at once and decoded by the batch engine this many requests at a time,
    as `draftwheel serve` serves that many concurrent clients (1 = one request at a time). At 4 rows the
    hybrid drafted most steps on an AMX Xeon (at 16 its governor turns most of them plain, and the logs
    would say little about the draft); where drafting does not pay at that load, as for the quick v0 on
    chat on an AVX-512 EPYC, the governor keeps the rows plain and the logs say so (`source: load`). The
    before/after table measures one request at a time either way."""
    dtype: str = "auto"
    """Serving precision (draftwheel.serving.engine.precision): auto = bfloat16 on CPUs with AMX-BF16 or AVX-512 BF16, else float32. The flywheel's
    shadow replay uses configs/shadow.yaml's own `dtype` (also auto)."""
    seed: int = 0
    trigger_ratio: float = 0.85
    """The monitor's threshold: this fraction of the acceptance the champion had on chat traffic."""
    min_acceptance: float = 0.0
    """An absolute monitor threshold instead (0 = use trigger_ratio)."""
    bootstrap_overrides: list[str] = field(default_factory=lambda: ["epochs=8", "bf16=auto", "n_prompts=160"])
    """On top of configs/bootstrap.yaml, only when the demo bootstraps (a fresh state dir): a v0 from 160
    chat prompts' completions instead of 256, 8 epochs instead of 16, generated and trained in bfloat16
    where that is fast (AMX or AVX-512 BF16 CPUs; float32 on others) (~6 min instead of ~18 on the AMX Xeon). It is
    weaker on chat than `draftwheel bootstrap`'s; the table reports what it does."""
    mining_overrides: list[str] = field(default_factory=lambda: ["holdout_fraction=0.2", "hard_quantile=1.0"])
    """On top of configs/mining.yaml: with this little traffic, every request counts as a training sample."""
    train_overrides: list[str] = field(default_factory=lambda: ["epochs=6", "learning_rate=4e-3", "mined_passes=5",
                                                                "rehearsal_ratio=2.0", "ttt_steps=3",
                                                                "prompt_variants=0", "prompt_renames=0",
                                                                "continue_to=192", "max_mined_per_epoch=320"])
    """On top of the shipped configs/<trainer>.yaml: twice a default round's epochs and learning rate, five
    passes over the mined code per epoch (4 by default) with two rehearsal sequences per mined one (as the
    default; with one, the demo's round lost 5 % of chat and prose on the probe, with two 2.5 % and 1.6 %),
    unrolled 3 steps (the default; `ttt_steps=3` keeps the demo's round fixed
    if that changes), without prompt variants or renames and with outputs continued to 192 tokens (the
    demo's round as measured; with variants it would train on about three times the sequences,
    docs/training.md), and at most 320 mined sequences per epoch (the demo's round mines about 51, so
    its 5 passes stay whole; the rounds benchmark's later rounds, which reuse this recipe on twice that,
    stay bounded, their rehearsal shrinking alike). Judged
    on code prompts from other stdlib files than the round's (what the demo's table measures):
    implied MAL 1.453 against 1.413 with 3 passes and 4 steps, in the same training
    time; the gate on the round's own hold-out measured +37.0 % with these, +35.4 % with those."""
    shadow_overrides: list[str] = field(default_factory=lambda: ["max_new_tokens=32", "min_requests=6"])
    """On top of configs/shadow.yaml: shorter replays. The canary set stays in, so the gate also weighs
    the chat and prose slices a code-only round could hurt."""
    trainer: str = "auto"
    """The flywheel's trainer: auto (the champion's kind: eagle for the eagle3 v0) | distill | dpo | eagle."""
    target: str = ""
    """Target model dir ("" = the one the champion was trained for; with no champion, the reference target,
    SmolLM2-135M-Instruct)."""
    start_from_v0: bool = True
    """Reset `champion` to the bootstrap (v0) draft first, so every demo run tells the same story."""
    tracking: bool = True
    out_dir: str = ""
    """Logs and results of this run go to <out_dir>/<UTC time>/ ("" = <state dir>/demo)."""

    def __post_init__(self) -> None:
        for name in ("chat_requests", "code_requests", "eval_requests", "max_new_tokens", "k", "max_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.after_requests < 0:
            raise ValueError(f"after_requests must be >= 0, got {self.after_requests}")
        if not 0.0 < self.trigger_ratio <= 1.0:
            raise ValueError(f"trigger_ratio must be in (0, 1], got {self.trigger_ratio}")
        if not 0.0 <= self.min_acceptance <= 1.0:
            raise ValueError(f"min_acceptance must be in [0, 1], got {self.min_acceptance}")
        if not 0.0 <= self.min_path_prob < 1.0:
            raise ValueError(f"min_path_prob must be in [0, 1), got {self.min_path_prob}")
        check_dtype_name(self.dtype)

    def flywheel_overrides(self) -> list[str]:
        """The demo's settings for the flywheel its monitor starts."""
        return [override("trainer", self.trainer), override("mining_overrides", self.mining_overrides),
                override("train_overrides", self.train_overrides), override("target", self.target),
                # The gate replays with the chains the demo serves: its k and confidence cut.
                override("shadow_overrides", [f"k={self.k}", f"min_path_prob={self.min_path_prob}",
                                              *self.shadow_overrides]),
                override("tracking", self.tracking)]

    def check_stages(self) -> None:
        """Check that flywheel's stage configs before the demo serves anything."""
        load_config(FlywheelConfig, None, self.flywheel_overrides()).check_stages()


def banner(step: int, text: str, started: float) -> None:
    print(f"\n[{step}/{STEPS}] {text}   (t+{time.perf_counter() - started:.0f}s)", flush=True)


def fresh_prompts(name: str, n: int, seed: int, exclude: set[str]) -> list[dict[str, str]]:
    """`n` distinct prompts of workload `name`, none of them in `exclude`."""
    from draftwheel.mining.workloads import build_workload

    candidates = build_workload(name, 2 * n + len(exclude), seed)  # enough even if most are excluded
    unique = {row["prompt"]: row for row in candidates if row["prompt"] not in exclude}
    if len(unique) < n:
        raise ValueError(f"{name}: only {len(unique)} fresh prompts for {n} requests; use fewer requests")
    return list(unique.values())[:n]


def workloads(config: DemoConfig, exclude: set[str]) -> dict[str, list[dict[str, str]]]:
    """Served traffic per phase and held-out eval prompts per slice: disjoint from each other and from
    `exclude` (the prompts the v0 draft was trained on), so no figure is measured on training prompts."""
    seen = set(exclude)
    rows: dict[str, list[dict[str, str]]] = {}
    plan = [("chat", "chat", config.chat_requests, config.seed), ("code", "code", config.code_requests, config.seed),
            ("after", "code", config.after_requests, config.seed + 1),
            *[(f"eval_{name}", name, config.eval_requests, config.seed + 1000) for name in SLICES]]
    for key, name, n, seed in plan:
        rows[key] = fresh_prompts(name, n, seed, seen) if n else []
        seen |= {row["prompt"] for row in rows[key]}
    return rows


def measure(engines: dict[str, tuple[Any, str]], rows: list[dict[str, str]], params: Any) -> dict[str, list[Any]]:
    """The completion of every prompt through each (engine, mode), taking them in turn prompt by prompt,
    so a change in machine load hits all of them alike. Nothing is logged."""
    from tqdm import tqdm

    names = list(engines)
    stats: dict[str, list[Any]] = {name: [] for name in names}
    for index, row in enumerate(tqdm(rows, desc=f"measure {rows[0]['slice'] if rows else ''}", unit="prompt",
                                     leave=False)):
        for name in names[index % len(names):] + names[:index % len(names)]:  # rotate who goes first
            engine, mode = engines[name]
            stats[name].append(engine.generate([row["prompt"]], params, slice=row["slice"], chat=True,
                                               mode=mode)[0])
    return stats


def identical(completions: list[Any], plain: list[Any]) -> str:
    """"n/m": prompts whose output equals plain decoding's (greedy: lossless speculation gives all)."""
    same = sum(a.token_ids == b.token_ids for a, b in zip(completions, plain))
    return f"{same}/{len(plain)}"


def chat_served_floor(chat: list[Any], trigger_ratio: float) -> float:
    """The demo monitor's as-served floor (mean accepted length, every step): the monitor's own, but never
    above `trigger_ratio` times what the champion delivers on the chat it was trained for (records
    `chat`). What a batch of chat delivers depends on the machine (served 4 at a time in float32 the
    hybrid takes more plain steps: 1.07 on a 2-core EPYC), and a floor above it would call the champion
    stale before the traffic shifts."""
    from draftwheel.flows.monitor import MonitorConfig, acceptance_by_slice

    delivered = acceptance_by_slice(chat, every_step=True)["overall"].mean_accepted_length
    return min(MonitorConfig().min_served_mal, trigger_ratio * delivered)


def monitor_overrides(config: DemoConfig, logs_dir: Path, threshold: float, run_flywheel: bool,
                      served_floor: float | None = None) -> list[str]:
    """The demo's monitor: this run's logs, a window of the latest traffic, the demo's flywheel settings,
    triggering below `threshold` draft acceptance or `served_floor` mean accepted length as served
    (None: configs/monitor.yaml's)."""
    window = max(4, min(config.code_requests, 32))
    return [f"logs_dir={logs_dir}", f"window_requests={window}", f"min_requests={max(2, window // 4)}",
            f"min_acceptance={threshold:.4f}", f"run_flywheel={str(run_flywheel).lower()}",
            *([f"min_served_mal={served_floor:.4f}"] if served_floor is not None else []),
            override("target", config.target), override("flywheel_overrides", config.flywheel_overrides())]


@dataclass
class DemoRun:
    """What the demo's steps share: config, models, prompts, where things go."""

    config: DemoConfig
    run_dir: Path
    engine: Any = None
    params: Any = None
    rows: dict[str, list[dict[str, str]]] = field(default_factory=dict)
    started: float = field(default_factory=time.perf_counter)

    @property
    def logs_dir(self) -> Path:
        return self.run_dir / "logs"

    def serve(self, rows: list[dict[str, str]]) -> dict[str, Any]:
        from draftwheel.mining.replay_workload import run_traffic, serving

        with serving(self.engine, self.config.max_batch) as served:
            summary = run_traffic(served, rows, self.logs_dir, self.params, progress=True)
        rates = {name: s["acceptance_rate"] for name, s in summary["by_slice"].items()}
        print(f"served {summary['requests']} requests in {summary['seconds']:.0f}s; acceptance {rates}", flush=True)
        return summary


def _start(config: DemoConfig) -> DemoRun:
    """Bootstrap if needed, start from the v0 draft, load the models once, build the prompts."""
    from draftwheel.flows import tasks
    from draftwheel.flows.bootstrap_flow import bootstrap_flow, bootstrap_prompts, v0_version
    from draftwheel.serving.engine.engine import Engine
    from draftwheel.serving.loading import load_model
    from draftwheel.serving.engine.params import SamplingParams
    from draftwheel.serving.engine.precision import resolve_dtype
    from draftwheel.serving.engine.suffix import SuffixIndex, target_key

    root = Path(config.out_dir) if config.out_dir else home.state_dir() / "demo"
    run = DemoRun(config, root / time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    banner(1, "bootstrap: reference target + v0 draft (skipped when a champion exists)", run.started)
    bootstrap_flow(overrides=config.bootstrap_overrides)
    v0 = v0_version()
    target = tasks.resolve_target(config.target)
    if config.start_from_v0 and v0 is not None and tasks.resolve_champion(CHAMPION_URI)["version"] != v0:
        print(f"a previous demo promoted a newer champion; starting again from the v0 draft (version {v0})")
        tasks.promote_version(v0, target_sha=target["sha256"])
    target_dir = target["dir"]
    loaded = load_model(target_dir)
    # Traffic is served as `draftwheel serve` serves it: with the suffix tier, mode hybrid beside an index
    # that learns from every finished request, so the logs say what the served stack missed (draftwheel.mining.residual).
    index = SuffixIndex(target_key(loaded.model_id)) if config.suffix_tier else None
    run.engine = Engine(loaded, load_model(CHAMPION_URI),  # run_traffic gives it a sink per phase
                        dtype=resolve_dtype(config.dtype), min_path_prob=config.min_path_prob, suffix_index=index)
    print(f"target {target_dir}; champion {CHAMPION_URI} = version {run.engine.draft.model_id.version}", flush=True)
    run.rows = workloads(config, bootstrap_prompts())
    run.params = SamplingParams(max_new_tokens=config.max_new_tokens, k=config.k, seed=config.seed)
    return run


def _shift_and_flywheel(run: DemoRun) -> dict[str, Any]:
    """Serve chat, check, serve code, check -> the monitor runs the flywheel. Returns the monitor's result."""
    from draftwheel.flows.monitor import MonitorConfig, acceptance_by_slice, monitor, read_records, window

    config = run.config
    banner(2, f"serve {config.chat_requests} chat requests with the champion", run.started)
    run.serve(run.rows["chat"])
    chat = window(read_records(run.logs_dir), MonitorConfig(window_requests=config.chat_requests, min_requests=1))
    chat_rate = acceptance_by_slice(chat)["overall"].acceptance_rate
    served_floor = chat_served_floor(chat, config.trigger_ratio)
    threshold = config.min_acceptance or config.trigger_ratio * chat_rate
    rule = "" if config.min_acceptance else f" = {config.trigger_ratio} x the chat acceptance {chat_rate:.3f}"
    banner(3, f"monitor: is the champion keeping up? (alert below {threshold:.3f}{rule}, or below "
              f"{served_floor:.2f} accepted length as served)", run.started)
    monitor(None, monitor_overrides(config, run.logs_dir, threshold, run_flywheel=False, served_floor=served_floor))
    banner(4, f"traffic shifts: serve {config.code_requests} code requests", run.started)
    run.serve(run.rows["code"])
    banner(5, "monitor: acceptance on code -> flywheel (mine -> train -> shadow -> promote)", run.started)
    outcome = monitor(None, monitor_overrides(config, run.logs_dir, threshold, run_flywheel=True,
                                              served_floor=served_floor))
    outcome["threshold"], outcome["served_floor"] = threshold, served_floor
    return outcome


def _log_results(config: DemoConfig, results: dict[str, Any], paths: dict[str, Path]) -> str | None:
    from draftwheel.tracking import get_tracker

    tracker = get_tracker(config.tracking)
    with tracker.run("demo", tags={"champion_before": str(results["meta"]["champion_before"]),
                                   "champion_after": str(results["meta"]["champion_after"])}) as run_id:
        tracker.log_params({f"demo.{k}": v for k, v in to_dict(config).items()})
        for phase in report.PHASES:
            for slice_name, figs in results[phase].items():
                tracker.log_metrics({f"{phase}.{slice_name}.{k}": v for k, v in figs.items()
                                     if isinstance(v, (int, float))})
        for path in paths.values():
            tracker.log_artifact(path)
    return run_id


@flow(name="demo")
def demo(config_path: str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """The main job: see the module docstring."""
    return run_demo(load_config(DemoConfig, config_path, overrides))


def _before_after(run: DemoRun, before: Any, after: Any) -> dict[str, Any]:
    """Plain decoding, the old champion and the new one on the held-out prompts of each slice: the drafts
    alone (mode draft), and with `suffix_tier` also as serving runs them with the suffix tier (mode
    hybrid, slices "<slice>/hybrid"), over an index of this run's logs that no measured request joins.
    A round that kept its champion is measured once and reported in both columns: a second measurement
    of the same model would show only the machine's noise as the round's change."""
    from draftwheel.serving.engine.engine import Engine
    from draftwheel.serving.engine.records import source_counts, source_shares
    from draftwheel.serving.engine.suffix import ReadOnlyIndex, SuffixIndex, target_key

    cut, target = run.config.min_path_prob, run.engine.target  # one target in memory, shared
    phases = ("before",) if after.model_id == before.model_id else report.PHASES
    drafts = {"before": before, "after": after}
    engines = {"plain": (run.engine, "autoregressive"),
               **{phase: (Engine(target, drafts[phase], min_path_prob=cut), "draft") for phase in phases}}
    if run.config.suffix_tier:
        index = ReadOnlyIndex(SuffixIndex.from_logs(run.logs_dir, target_key(target.model_id)))
        for phase in phases:
            engines[f"{phase}/hybrid"] = (Engine(target, drafts[phase], min_path_prob=cut, suffix_index=index),
                                          "hybrid")
    results: dict[str, Any] = {"before": {}, "after": {}}
    for name in SLICES:
        runs = measure(engines, run.rows[f"eval_{name}"], run.params)
        for tier in ("", "/hybrid") if run.config.suffix_tier else ("",):
            for phase in phases:
                results[phase][name + tier] = {
                    **report.figures([c.stats for c in runs[phase + tier]], [c.stats for c in runs["plain"]]),
                    "greedy_identical": identical(runs[phase + tier], runs["plain"]),
                    "steps_by_source": source_shares(source_counts(c.record for c in runs[phase + tier]))}
    if phases == ("before",):
        results["after"] = copy.deepcopy(results["before"])
    return results


def run_demo(config: DemoConfig) -> dict[str, Any]:
    from draftwheel.flows.monitor import monitor
    from draftwheel.serving.loading import load_model

    run = _start(config)
    old = run.engine.draft
    outcome = _shift_and_flywheel(run)
    run.engine.swap_draft(load_model(CHAMPION_URI))
    new = run.engine.draft
    if config.after_requests:
        banner(6, f"the champion (version {new.model_id.version}) serves {config.after_requests} code requests",
               run.started)
        run.serve(run.rows["after"])
        monitor(None, monitor_overrides(config, run.logs_dir, outcome["threshold"], run_flywheel=False,
                                        served_floor=outcome["served_floor"]))
    drafts = (f"version {old.model_id.version} and version {new.model_id.version}" if new.model_id != old.model_id
              else f"version {old.model_id.version} (kept: measured once)")
    banner(7, f"before / after: plain decoding, {drafts} on {config.eval_requests} held-out prompts per slice",
           run.started)
    results = _before_after(run, old, new)
    flywheel_result = outcome.get("flywheel") or {}
    results["meta"] = {
        "champion_before": old.model_id.version, "champion_after": new.model_id.version,
        "monitor": outcome["decision"], "promoted": flywheel_result.get("promoted", False),
        "decision": (flywheel_result.get("decision") or {}).get("reasons"),
        "shadow_report": flywheel_result.get("report_path"), "k": config.k,
        "max_new_tokens": config.max_new_tokens, "eval_requests_per_slice": config.eval_requests,
        "wall_time_s": round(time.perf_counter() - run.started, 1), "logs_dir": str(run.logs_dir)}
    paths = report.save(results, run.run_dir)
    run_id = _log_results(config, results, paths)
    artifacts.publish_demo(results)
    print()
    report.print_table(results)
    print("\nthe round, as `draftwheel serve` runs it (hybrid) and for the draft alone:")
    for line in report.headline(results):
        print("  " + line)
    print("where the as-served steps came from (share of the steps x tokens each):")
    for line in report.served_steps(results):
        print("  " + line)
    print(f"\nwall time {results['meta']['wall_time_s']:.0f}s; results: {paths['markdown']} (+ .json, .png)")
    print(f"MLflow (run {run_id}): mlflow ui --backend-store-uri {home.tracking_uri()}", flush=True)
    return results
