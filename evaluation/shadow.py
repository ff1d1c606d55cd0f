"""Shadow replay: champion vs challenger draft on the same prompts, then the gate's decision.

`run_shadow` replays the mined holdout set (and the repo's fixed canary prompts) through one target
with each draft, **as `draftwheel serve` runs it**: with `suffix_tier` (the default) in mode hybrid,
both drafts beside one suffix index built from the serving logs as serving would have had it when the
held-out requests arrived -- every logged request except the replayed prompts themselves (their answers
would be copied verbatim) -- read-only, so neither arm learns from the other's replays. With
`draft_alone` each draft is also replayed in mode draft, the figure training and the monitor used to
lead with; it is reported beside the as-served one and never gated on.

Every prompt runs with the same sampling settings and seed for both drafts; the order of the two drafts
alternates from prompt to prompt so slow drift of the machine (thermal, other load) does not favour one
side. Per request it records mean accepted length, acceptance rate, wall-clock tokens/s and the steps'
cost under `draftwheel.evaluation.served_cost`'s model (verify cost per row count, measured on the target once per
replay, and each draft's c, measured over its replays), from which the gate's default figure,
`served_speedup`, is computed. With `workers` > 1 the prompts are shared out to that many processes
(as served: whole slices, with the choices on the cost model). It checks losslessness (greedy output of
each draft, as served and alone, identical to target-only greedy decoding: one teacher-forced pass,
draftwheel.evaluation.greedy_check, and a target-only decode only to report a difference), and hands
the report to `draftwheel.evaluation.gate`. It writes report.json and the plot when asked, and logs
both to a tracker passed in. It does not touch the registry: moving aliases after a passing gate is the
caller's decision (see `draftwheel.flows.registry_cli`).
"""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator

import torch

from draftwheel import home
from draftwheel.config import SHIPPED_CONFIGS, to_dict
from draftwheel.tracking import NullTracker
from draftwheel.serving.engine.engine import Completion, Engine
from draftwheel.evaluation.gate import ShadowConfig, gate, plot_slices, slice_table, summarize
from draftwheel.evaluation.greedy_check import greedy_divergence
from draftwheel.serving.engine.acceptance import common_prefix
from draftwheel.serving.engine.models import LoadedModel
from draftwheel.serving.loading import load_model
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.engine.precision import resolve_dtype
from draftwheel.serving.engine.records import source_counts
from draftwheel.evaluation.served_cost import (StepCost, draft_c, measure_row_costs, modelled_time,
                                               served_speedup)
from draftwheel.serving.engine.adaptive import ModelledTime
from draftwheel.serving.engine.sink import log_files, valid_records
from draftwheel.serving.engine.suffix import ReadOnlyIndex, SuffixConfig, SuffixIndex, target_key

log = logging.getLogger(__name__)

REPORT_SCHEMA = 1
DEFAULT_CANARY = SHIPPED_CONFIGS / "canary.jsonl"

__all__ = ["ShadowConfig", "gate", "load_requests", "run_shadow"]


@dataclass
class ShadowRequest:
    id: str
    prompt: str
    slice: str
    max_new_tokens: int
    chat: bool  # canary prompts are user messages (chat template applied); holdout prompts are as fed
    source: str


def load_canary(path: str | Path) -> list[ShadowRequest]:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [ShadowRequest(id=r["id"], prompt=r["prompt"], slice=r["slice"], max_new_tokens=int(r["max_new_tokens"]),
                          chat=True, source="canary") for r in rows]


def load_holdout(holdout_dir: str | Path, limit: int = 0) -> list[ShadowRequest]:
    """Rows of a mined holdout dataset (HF `save_to_disk`), in stored order, at most `limit` (0 = all)."""
    from datasets import load_from_disk

    data = load_from_disk(str(holdout_dir))
    n = len(data) if not limit else min(limit, len(data))
    return [ShadowRequest(id=str(r["request_id"]), prompt=r["prompt"], slice=r["slice"],
                          max_new_tokens=int(r["max_new_tokens"]), chat=False, source="holdout")
            for r in data.select(range(n))]


def load_requests(holdout_dir: str | Path | None, config: ShadowConfig) -> list[ShadowRequest]:
    requests = load_holdout(holdout_dir, config.max_requests) if holdout_dir else []
    if config.include_canary:
        requests += load_canary(config.canary_path or DEFAULT_CANARY)
    if not requests:
        raise ValueError("shadow: nothing to replay (no holdout dir and include_canary is off)")
    return requests


def _params(request: ShadowRequest, index: int, config: ShadowConfig, greedy: bool = False) -> SamplingParams:
    return SamplingParams(max_new_tokens=config.max_new_tokens or request.max_new_tokens,
                          temperature=0.0 if greedy else config.temperature, seed=config.seed + index, k=config.k)


def _figures(completion: Completion, row_costs: list[float]) -> dict[str, Any]:
    """One replay's figures: acceptance, wall clock, and its steps summarized for the cost model
    (`served_speedup` is filled in once each draft's c is known, `add_served_speedup`)."""
    stats, record = completion.stats, completion.record
    cost = StepCost.of(record.steps, row_costs, record.mode)
    return {"mean_accepted_length": stats.mean_accepted_length, "acceptance_rate": stats.acceptance_rate,
            "tokens_per_s": stats.tokens_per_s, "generated_tokens": stats.generated_tokens,
            "verify_steps": stats.verify_steps, "mode": record.mode, "draft_s": stats.draft_s,
            "verify_s": stats.verify_s, "step_tokens": cost.tokens, "verify_cost": cost.verify_cost,
            "model_drafted": cost.model_drafted, "steps_by_source": source_counts([record])}


def _run(engine: Engine, request: ShadowRequest, params: SamplingParams, mode: str | None = None) -> Completion:
    """One replay; mode None = the arm's serving mode (hybrid with the suffix tier, else draft)."""
    return engine.generate([request.prompt], params, slice=request.slice, chat=request.chat,
                           mode=mode or engine.default_mode)[0]


ARMS = ("champion", "challenger")


def _replay_one(engines: dict[str, Engine], request: ShadowRequest, index: int, config: ShadowConfig,
                row_costs: list[float]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One prompt through champion and challenger, as served (and, with `draft_alone` and the suffix tier,
    in mode draft too): (request row, lossless mismatches)."""
    params = _params(request, index, config)
    order = ARMS if index % 2 == 0 else ARMS[::-1]
    modes = [None] + (["draft"] if config.draft_alone and config.suffix_tier else [])
    runs = {(arm, mode): _run(engines[arm], request, params, mode) for mode in modes for arm in order}
    row = {"id": request.id, "slice": request.slice, "source": request.source}
    for arm in ARMS:
        row[arm] = _figures(runs[arm, None], row_costs)
        if "draft" in modes:
            row[arm]["draft_alone"] = _figures(runs[arm, "draft"], row_costs)
    mismatches, reference, verified = [], None, []
    for (arm, mode), run in runs.items():
        greedy = run if params.greedy else _run(engines[arm], request, _params(request, index, config, greedy=True),
                                                mode)
        # Usually every run returns the same tokens: once those are shown to be the target's, the other
        # runs need no second teacher-forced pass.
        if greedy.token_ids in verified or _is_target_greedy(engines["target"], greedy, params.max_new_tokens):
            verified.append(greedy.token_ids)
            continue
        # The one-pass check found a difference: decode target-only, once, and report against that.
        reference = reference or _run(engines["target"], request, _params(request, index, config, greedy=True),
                                      "autoregressive")
        if greedy.token_ids != reference.token_ids:
            mismatches.append({"id": request.id, "model": arm, "mode": greedy.record.mode,
                               "first_difference": common_prefix(greedy.token_ids, reference.token_ids)})
    return row, mismatches


def _is_target_greedy(target: Engine, completion: Completion, max_new_tokens: int) -> bool:
    """Whether `completion` is target-only greedy decoding's output, from one teacher-forced pass
    (draftwheel.evaluation.greedy_check) instead of decoding the prompt again."""
    return greedy_divergence(target.target.model, target.eos_ids, completion.prompt_token_ids,
                             completion.token_ids, max_new_tokens) is None


def _engines(models: dict[str, LoadedModel], config: ShadowConfig, requests: list[ShadowRequest],
             timing: dict[str, ModelledTime] | None = None) -> dict[str, Engine]:
    """Engines sharing one target object (no second copy in memory): target-only, champion, challenger.
    With the suffix tier both drafts read the same index (`served_index`) through a read-only view, so
    neither learns from its own or the other's replays and the target-only reference run feeds neither.
    With `timing`, each draft's engine decides by its `ModelledTime` (`modelled_times`)."""
    target = models["target"]
    reference = Engine(target, dtype=resolve_dtype(config.dtype))  # casts the shared target once
    index = served_index(reference, requests, config) if config.suffix_tier else None
    return {"target": reference, **{arm: Engine(target, models[arm], min_path_prob=config.min_path_prob,
                                                suffix_index=ReadOnlyIndex(index) if index is not None else None,
                                                modelled_time=(timing or {}).get(arm))
                                         for arm in ARMS}}


def modelled_times(models: dict[str, LoadedModel], config: ShadowConfig, request: ShadowRequest,
                   row_costs: list[float]) -> dict[str, ModelledTime]:
    """Per draft, the modelled time its replay decides by (`ShadowConfig.modelled_time`): the row costs
    (and their slope), and its c from one draft-alone request (the first replayed prompt), timed against that
    request's own verify forwards (draftwheel.evaluation.served_cost.draft_c).
    Two drafts of the same shapes do the same work per token, so they share the mean of their two c's:
    one warm-up request's c moves by a quarter between runs, and it must not decide which arm drafts more."""
    params = _params(request, 0, config, greedy=True)
    engines = {arm: Engine(models["target"], models[arm], dtype=resolve_dtype(config.dtype),
                           min_path_prob=config.min_path_prob) for arm in ARMS}
    timing = {arm: modelled_time(row_costs, _run(engine, request, params, "draft")) for arm, engine in engines.items()}
    shapes = {arm: [tuple(p.shape) for p in models[arm].model.parameters()] for arm in ARMS}
    if shapes["champion"] == shapes["challenger"]:  # the same computation per token: one c, not two noisy ones
        c = sum(t.draft_c for t in timing.values()) / len(timing)
        timing = {arm: ModelledTime(row_slope=t.row_slope, draft_c=c, row_costs=t.row_costs) for arm, t in timing.items()}
    return timing


def served_index(engine: Engine, requests: list[ShadowRequest], config: ShadowConfig) -> SuffixIndex:
    """The suffix index serving had when the held-out requests came in: every request of `engine`'s
    target in the serving logs (`suffix_logs`, default the state dir's logs/) except those whose prompt
    is one being replayed, whose logged answers the index would otherwise copy. Serving's bounds apply."""
    logs = Path(config.suffix_logs) if config.suffix_logs else home.logs_dir()
    target = engine.target.model_id
    index = SuffixIndex(target_key(target), SuffixConfig())
    if not logs.is_dir():
        log.info("shadow: no serving logs at %s: the suffix index starts empty", logs)
        return index
    replayed = {tuple(engine.encode(r.prompt, r.chat)[1]) for r in requests}
    excluded = 0
    for record in valid_records(log_files(logs)):
        # add_record itself skips (False) a record of another target
        if tuple(record.prompt_token_ids) in replayed or not index.add_record(record):
            excluded += 1
    log.info("shadow: suffix index from %s: %d requests (%d left out: replayed prompts or another target)",
             logs, index.requests, excluded)
    return index


def _as_loaded(spec: str | Path | LoadedModel) -> LoadedModel:
    return spec if isinstance(spec, LoadedModel) else load_model(spec)


def _describe(spec: Any, loaded: LoadedModel) -> dict[str, str]:
    return {"spec": str(loaded.path if isinstance(spec, LoadedModel) else spec), **asdict(loaded.model_id)}


# Starting a replay process (imports, loading the models) costs ~8 s on a 2-core CPU, two or three
# replays of a 64-token request: auto stays in this process for fewer requests than this.
AUTO_WORKERS_MIN_REQUESTS = 16


def replay_workers(config: ShadowConfig, n_requests: int, n_slices: int = 1) -> int:
    """How many replay processes: config.workers, or for 0 (auto) one per CPU core, at most 4, once
    there are AUTO_WORKERS_MIN_REQUESTS requests. As served (`suffix_tier`) each draft's step pace
    (draftwheel.serving.engine.adaptive.PaceMemory) carries from one request of a slice to the next, in
    order, as in serving: the replay is shared out by whole slices (`slice_shards`), so never more
    processes than slices, and only with `modelled_time`, where the choices do not read the clock."""
    if config.suffix_tier and not config.modelled_time:
        return 1
    limit = max(n_slices if config.suffix_tier else n_requests, 1)
    if config.workers:
        return min(config.workers, limit)
    if n_requests < AUTO_WORKERS_MIN_REQUESTS:
        return 1
    return min(len(os.sched_getaffinity(0)), 4, limit)


def slice_shards(requests: list[ShadowRequest]) -> list[list[tuple[int, ShadowRequest]]]:
    """The (index, request) jobs of each slice, in request order, the largest slice first: a pool that
    takes the next shard as it finishes one then ends its slices at about the same time."""
    shards: dict[str, list[tuple[int, ShadowRequest]]] = {}
    for index, request in enumerate(requests):
        shards.setdefault(request.slice, []).append((index, request))
    return sorted(shards.values(), key=len, reverse=True)


TIMED = ("tokens_per_s", "draft_s", "verify_s", "verify_cost", "served_speedup")
"""Per-request figures that come from a clock (the cost model's constants are measured too)."""


def replay_figures(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Per request and draft, every figure but the timed ones (`TIMED`): what the replay's `workers` must not change."""
    def untimed(figures: dict[str, Any]) -> dict[str, Any]:
        return {k: untimed(v) if isinstance(v, dict) else v for k, v in figures.items() if k not in TIMED}

    return [(row["id"], {arm: untimed(row[arm]) for arm in ARMS}) for row in report["requests"]]


def _replays(requests: list[ShadowRequest], models: dict[str, LoadedModel], config: ShadowConfig,
             workers: int, row_costs: list[float],
             timing: dict[str, ModelledTime] | None = None) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """(row, mismatches) per request, in request order: in this process (workers 1) or in `workers`
    processes, each taking the next request (the draft alone) or the next whole slice (as served)."""
    jobs = list(enumerate(requests))
    if workers == 1:
        engines = _engines(models, config, requests, timing)
        yield from (_replay_one(engines, request, index, config, row_costs) for index, request in jobs)
        return
    # Each worker loads the models from their directories: a spawned process gets paths, not 500 MB pickles.
    threads = max(1, len(os.sched_getaffinity(0)) // workers)
    paths = {name: str(model.path) for name, model in models.items()}
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_start_worker,
                               initargs=(paths, config, threads, os.getpid(), requests, row_costs, timing))
    try:
        if not config.suffix_tier:
            yield from pool.map(_replay_job, jobs)
            return
        done = dict(item for shard in pool.map(_replay_shard, slice_shards(requests)) for item in shard)
        yield from (done[index] for index, _ in jobs)
    finally:  # after a failed replay, do not wait for the prompts not yet started
        pool.shutdown(cancel_futures=True)


def exit_with_parent(parent: int, poll_s: float = 1.0) -> None:
    """End this process once `parent` is no longer its parent. A pool worker whose parent was killed
    (a cancelled flow, `kill -9`) would otherwise wait on its task queue for ever, holding the models."""
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


_WORKER: dict[str, Any] = {}  # a replay process's engines and config (set by _start_worker)


def _start_worker(paths: dict[str, str], config: ShadowConfig, threads: int, parent: int,
                  requests: list[ShadowRequest], row_costs: list[float],
                  timing: dict[str, ModelledTime] | None = None) -> None:
    exit_with_parent(parent)
    torch.set_num_threads(threads)
    _WORKER["engines"] = _engines({name: load_model(path) for name, path in paths.items()}, config, requests,
                                  timing)
    _WORKER["config"], _WORKER["row_costs"] = config, row_costs


def _replay_job(job: tuple[int, ShadowRequest]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    index, request = job
    return _replay_one(_WORKER["engines"], request, index, _WORKER["config"], _WORKER["row_costs"])


def _replay_shard(shard: list[tuple[int, ShadowRequest]]) -> list[tuple[int, tuple[dict[str, Any], list[dict[str, Any]]]]]:
    return [(job[0], _replay_job(job)) for job in shard]


def add_served_speedup(rows: list[dict[str, Any]]) -> dict[str, float]:
    """Fill in each replay's `served_speedup` (draftwheel.evaluation.served_cost) with its draft's c, measured over all of
    that draft's replays in the same mode (drafting seconds per model-drafted token against the same
    replays' verify seconds per unit of verify cost: `served_cost.draft_c`); return those c's by "arm"
    and "arm/draft_alone"."""
    def replays(arm: str, alone: bool) -> list[dict[str, Any]]:
        return [row[arm]["draft_alone"] if alone else row[arm] for row in rows if not alone or "draft_alone" in row[arm]]

    costs = {}
    for arm in ARMS:
        for alone in (False, True):
            figures = replays(arm, alone)
            if not figures:
                continue
            c = draft_c(*(sum(f[key] for f in figures) for key in ("draft_s", "model_drafted", "verify_s",
                                                                   "verify_cost")))
            costs[f"{arm}/draft_alone" if alone else arm] = c
            for f in figures:
                f["served_speedup"] = served_speedup(
                    StepCost(f["step_tokens"], f["verify_cost"], f["model_drafted"]), c)
    return costs


def served_row_costs(target: LoadedModel, config: ShadowConfig) -> tuple[list[float], float]:
    """The target's verify cost per row count (draftwheel.evaluation.served_cost), in the replay's precision, up to the
    longest step a replay can verify: k drafted tokens, the suffix index's longest proposal, or both as
    one token tree (the hybrid's greedy steps, draftwheel.serving.engine.tree)."""
    reference = Engine(target, dtype=resolve_dtype(config.dtype))  # the replay's precision and packing
    longest = config.k + SuffixConfig().max_spec_tokens if config.suffix_tier else config.k
    return measure_row_costs(reference.target.model, longest + 1)


def run_shadow(champion: str | Path | LoadedModel, challenger: str | Path | LoadedModel,
               target: str | Path | LoadedModel, holdout_dir: str | Path | None, config: ShadowConfig,
               tracker: Any = None, out: str | Path | None = None, own_run: bool = True) -> dict[str, Any]:
    """Replay, summarize and gate; return the report (also written to `out` with a PNG beside it).

    The report goes to `tracker` in a nested run "shadow", or, with `own_run=False`, into the caller's
    open run (the flywheel's shadow stage run)."""
    tracker = tracker or NullTracker()
    requests = load_requests(holdout_dir, config)
    models = {"target": _as_loaded(target), "champion": _as_loaded(champion), "challenger": _as_loaded(challenger)}
    workers = replay_workers(config, len(requests), len({r.slice for r in requests}))
    started = time.time()
    row_costs, one_row_s = served_row_costs(models["target"], config)
    timing = modelled_times(models, config, requests[0], row_costs) \
        if config.modelled_time and requests else None
    rows, mismatches = [], []
    replays = _replays(requests, models, config, workers, row_costs, timing)
    for index, (request, (row, bad)) in enumerate(zip(requests, replays)):
        rows.append(row)
        mismatches += bad
        log.info("shadow %d/%d %s [%s]: accepted length %.2f (champion) vs %.2f (challenger)%s", index + 1,
                 len(requests), request.id, request.slice, row["champion"]["mean_accepted_length"],
                 row["challenger"]["mean_accepted_length"], "  LOSSY" if bad else "")
    report = {"schema": REPORT_SCHEMA, "created": started, "replay_seconds": time.time() - started,
              "config": to_dict(config), "holdout": str(holdout_dir) if holdout_dir else None,
              **{name: _describe(spec, models[name]) for name, spec in
                 (("target", target), ("champion", champion), ("challenger", challenger))},
              "requests": rows, "lossless": {"checked": len(rows), "mismatches": mismatches},
              "workers": workers, "cost_model": {"row_costs": row_costs, "one_row_s": one_row_s,
                                                 "draft_c": add_served_speedup(rows),
                                                 "modelled_time": {arm: vars(t) for arm, t in (timing or {}).items()}}}
    report.update(summarize(rows, config))
    decision = gate(report, config)
    report["decision"] = decision.as_dict()
    log.info("shadow gate: %s\n%s", "PROMOTE" if decision.promote else "reject", slice_table(decision))
    _publish(report, config, tracker, out, own_run)
    return report


def _publish(report: dict[str, Any], config: ShadowConfig, tracker: Any, out: str | Path | None,
             own_run: bool) -> None:
    """Write report.json + plot (when `out` is set) and log params, figures and files to the tracker."""
    import matplotlib.pyplot as plt

    overall = report["overall"]
    title = (f"challenger {report['challenger']['version'] or report['challenger']['name']} vs champion "
             f"{report['champion']['version'] or report['champion']['name']}: "
             f"{'PROMOTE' if report['decision']['promote'] else 'reject'}")
    fig = plot_slices(report, title)
    if out is not None:
        out = Path(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2))
        fig.savefig(out.with_suffix(".png"), dpi=120)
    run = tracker.run("shadow", nested=True, tags={"draftwheel.stage": "shadow"}) if own_run else nullcontext()
    with run:
        tracker.log_params({f"shadow.{k}": v for k, v in report["config"].items()})
        tracker.log_metrics({"gain_mean": overall["difference"]["mean"], "gain_ci_low": overall["difference"]["ci_low"],
                             "gain_ci_high": overall["difference"]["ci_high"],
                             "champion_mal": overall["champion"]["mean"], "challenger_mal": overall["challenger"]["mean"],
                             "lossless_mismatches": len(report["lossless"]["mismatches"]),
                             "promote": float(report["decision"]["promote"])})
        tracker.log_metrics({f"steps.{name}.{arm}.{source}": share["share"]
                             for name, figures in report["slices"].items() for arm in ARMS
                             for source, share in figures[arm].get("steps_by_source", {}).items()})
        tracker.log_dict(report, "shadow_report.json")
        tracker.log_figure(fig, "shadow_slices.png")
    plt.close(fig)
