"""The `flywheel` flow: mine -> train -> shadow -> register -> promote (through the gate).

One MLflow parent run per flow run, one nested run per stage, with the manifest and the shadow report
attached. Every stage's config (mining, trainer, shadow, with their overrides) is loaded before the first
stage starts, so a bad field fails in seconds. One run at a time per state dir: a run holds the
`flywheel` lock (`draftwheel.locks`) and a second one fails at once, naming the lock file.
A candidate reaches `champion` only when the shadow gate says so, `promote` is on and the champion is
still the one it was gated against; any stage failure stops the flow before the registry is touched, marks
the stage's and the parent's MLflow runs FAILED (tags `failed_stage`, `failure_reason`) and fails the
Prefect flow run. Mining keeps a replay share of every served slice (the logs' and the canary set's); when
the gate rejects on slice regressions alone, the turn retries (`max_retries`) with more replay of the
blocking slices, or more rehearsal where they have nothing logged to replay (`draftwheel.flows.replay`); each attempt
is a nested MLflow run `attempt-N` holding its stages. Registering and promoting go through
`draftwheel.registry`, as on the command line. The gate's decision and champion vs challenger are
also Prefect artifacts of the flow run (`draftwheel.flows.artifacts`).
This module wires stages; what each stage does lives in mining/, training/, serving/ and draftwheel/.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from prefect import flow

from draftwheel import home
from draftwheel.config import ConfigError, load_config, stage_config_path, to_dict
from draftwheel.locks import state_lock
from draftwheel.registry_names import CHAMPION_URI, MEDUSA_MODEL, PARENT_TAG, URI_PREFIX
from draftwheel.flows import artifacts, replay, tasks
from draftwheel.training.trainers import TRAINERS

BUILTIN_TRAINERS = tuple(TRAINERS)
AUTO = "auto"
AUTO_CHOICES = {"eagle3": "eagle", "lm": "distill"}  # champion draft kind -> the trainer that improves it


def trainer_for(config: "FlywheelConfig", champion_dir: str) -> str:
    """The trainer this turn runs: the configured one, or with `auto` the one for the champion's kind."""
    if config.trainer != AUTO:
        return config.trainer
    from draftwheel.serving.engine.eagle import is_eagle3_dir

    return AUTO_CHOICES["eagle3" if is_eagle3_dir(champion_dir) else "lm"]
MEDUSA_NOTE = ("medusa: shadow replay compares draft models, so Medusa heads are registered as challenger of "
               f"{MEDUSA_MODEL} and not promoted by the flywheel; promote them explicitly")


@dataclass
class FlywheelConfig:
    """One turn of the flywheel: which trainer, each stage's config, where things are."""

    trainer: str = "auto"
    """auto (the champion's kind: eagle for an eagle3 champion, else distill) | distill | dpo | medusa | eagle,
    or "package.module:function" for your own trainer (see draftwheel.flows.tasks)."""
    logs_dir: str = ""
    """Serving logs to mine ("" = the state dir's logs/)."""
    target: str = ""
    """Target model dir or hub id ("" = the one the champion was trained for, as the registry recorded it;
    with no champion, the reference target in the state dir)."""
    champion_uri: str = CHAMPION_URI
    mining_config: str = ""
    """MiningConfig YAML ("" = the shipped configs/mining.yaml); `mining_overrides` are key=value on top."""
    mining_overrides: list[str] = field(default_factory=list)
    train_config: str = ""
    """The trainer's YAML ("" = the shipped configs/<trainer>.yaml). Data, start, target, output: set by the flow."""
    train_overrides: list[str] = field(default_factory=list)
    launcher: str = ""
    """Run a built-in trainer as a subprocess, `<launcher> -m draftwheel.training.<trainer> ...`, e.g. "accelerate
    launch --multi_gpu --num_processes 4" or "accelerate launch --config_file ds.yaml" (data parallel: each
    process its shard, gradients all-reduced, rank 0 writes; docs/training.md) ("" = in-process)."""
    shadow_config: str = ""
    """ShadowConfig YAML, the gate's thresholds ("" = the shipped configs/shadow.yaml)."""
    shadow_overrides: list[str] = field(default_factory=list)
    promote: bool = True
    """Promote a candidate that passes the gate (False = register it as challenger only)."""
    tracking: bool = True
    """Log runs to MLflow (the registry is used either way)."""
    work_dir: str = ""
    """Per-run datasets and reports go under here ("" = <state dir>/flywheel)."""
    corpus: bool = True
    """Keep every round's mined rows in the retained corpus (draftwheel.mining.corpus) and train each round on a sample
    of earlier rounds' rows too, so round n's draft has seen rounds 1..n."""
    corpus_dir: str = ""
    """Where the corpus lives ("" = <state dir>/corpus)."""
    corpus_max_per_slice: int = 2000
    """Rows the corpus keeps per slice (the newest)."""
    corpus_max_age_days: float = 90.0
    """Rows older than this leave the corpus (0 = no age limit)."""
    corpus_ratio: float = 1.0
    """Earlier rounds' rows sampled into a round's training set, per row the round mined."""
    focus_new_traffic: bool = True
    """With the corpus: mine a round's focus samples (hard, rollback, uniform) from the traffic served since
    the last round mined (mining `focus_after`), earlier rounds' rows coming from the corpus, so a round's
    training does not grow with every request served so far. False = each round mines all the logs again."""
    max_retries: int = 1
    """Attempts after the first when the gate rejects on slice regressions alone (0 = never retry)."""
    retry_replay_boost: float = 3.0
    """A retry multiplies the blocking slices' replay quota (mining `replay_boost`) by this, or the trainer's
    `rehearsal_ratio` for blocking slices with no replay samples in the logs."""

    def __post_init__(self) -> None:
        if self.trainer not in BUILTIN_TRAINERS + (AUTO,) and ":" not in self.trainer:
            raise ValueError(f"trainer must be one of {', '.join(BUILTIN_TRAINERS)} or 'package.module:function', "
                             f"got {self.trainer!r}")
        if self.max_retries < 0:
            raise ValueError(f"max_retries: must be >= 0, got {self.max_retries!r}")
        if self.retry_replay_boost <= 1.0:
            raise ValueError(f"retry_replay_boost: must be > 1 (a retry with the same data repeats the "
                             f"first attempt), got {self.retry_replay_boost!r}")
        self.corpus_policy()  # its bounds are checked here, before any stage runs
        if self.launcher:
            tasks.check_launcher(self.launcher)
        if not self.champion_uri.startswith(URI_PREFIX):
            raise ValueError(f"champion_uri must be a registry URI {URI_PREFIX}NAME@ALIAS, got {self.champion_uri!r}")
        for name in ("mining_config", "train_config", "shadow_config"):
            path = getattr(self, name)
            if path and not Path(path).is_file():
                raise ValueError(f"{name}: no such file {path!r}")

    def corpus_policy(self) -> Any:
        """The retained corpus's bounds (draftwheel.mining.corpus.CorpusPolicy), or None with `corpus` off."""
        from draftwheel.mining.corpus import CorpusPolicy

        policy = CorpusPolicy(self.corpus_max_per_slice, self.corpus_max_age_days, self.corpus_ratio)
        return policy if self.corpus else None

    def check_stages(self) -> None:
        """Load every stage's config with its overrides (the flow's own paths as placeholders): a bad
        field raises `ConfigError` naming the stage and the field, before any stage runs."""
        from draftwheel.mining.config import MiningConfig
        from draftwheel.evaluation.shadow import ShadowConfig

        checks = [("mining", MiningConfig, self.mining_config, "mining", list(self.mining_overrides)),
                  ("shadow", ShadowConfig, self.shadow_config, "shadow", list(self.shadow_overrides))]
        for stage_name, cls, path, shipped, overrides in checks:
            try:
                load_config(cls, stage_config_path(path, shipped) or None, overrides)
            except ValueError as exc:
                raise ConfigError(f"{stage_name} stage: {exc}") from exc
        self._check_train_stage()

    def _check_train_stage(self) -> None:
        """The trainer's config with its overrides. `auto` learns its trainer from the champion only at run
        time, so its overrides must suit at least one trainer it may pick (each one's error is named)."""
        names = [n for n in (AUTO_CHOICES.values() if self.trainer == AUTO else [self.trainer]) if n in TRAINERS]
        errors = []
        for name in names:
            try:
                self.train_stage_config(name)
            except ValueError as exc:
                errors.append(f"{name}: {exc}")
        if names and len(errors) == len(names):
            raise ConfigError("train stage: " + "; ".join(errors))

    def train_stage_config(self, name: str) -> Any:
        """Built-in trainer `name`'s config with this turn's overrides (the flow's own paths as placeholders)."""
        placeholders = tasks.stage_overrides(name, "datasets", "champion", "target", "candidate")
        return load_config(TRAINERS[name].load()[0], stage_config_path(self.train_config, name) or None,
                           list(self.train_overrides) + placeholders)


def override(key: str, value: Any) -> str:
    """A `key=value` config override whose value survives the YAML parsing of overrides (lists, dicts)."""
    return f"{key}={json.dumps(value)}"


class StageError(RuntimeError):
    """A flywheel stage failed; `stage` names it and `reason` says why."""

    def __init__(self, stage: str, reason: str):
        super().__init__(f"flywheel stage {stage!r} failed: {reason}")
        self.stage = stage
        self.reason = reason


@contextlib.contextmanager
def stage(tracker: Any, name: str) -> Iterator[None]:
    """A nested MLflow run around one stage, with a visible banner; failures become `StageError`."""
    print(f"\n=== flywheel: {name} ===", flush=True)
    with tracker.run(name, nested=True):
        try:
            yield
        except StageError:
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"[:1000]
            tracker.set_tags({"failure_reason": reason})
            raise StageError(name, reason) from exc


def run_dir(config: FlywheelConfig) -> Path:
    return home.timestamped_dir("flywheel", config.work_dir or None)


def _train(config: FlywheelConfig, tracker: Any, work: Path, mined: dict, champion: dict,
           target: dict) -> dict[str, Any]:
    builtin = config.trainer in BUILTIN_TRAINERS
    config_path = stage_config_path(config.train_config, config.trainer) if builtin else config.train_config
    key = tasks.train_cache_key(config.trainer, mined["data_sha256"], config_path,
                                config.train_overrides, champion["sha256"], target["sha256"])
    out_dir = home.models_dir() / "candidates" / key[:16]
    # A cached result whose model dir was deleted is useless: retrain instead of returning it. The cache
    # lives in the state dir beside the candidates it names, whichever Prefect home the user runs with.
    train = tasks.train_candidate.with_options(refresh_cache=not (out_dir / "config.json").is_file(),
                                               result_storage=home.prefect_home() / "storage")
    trained = train(config.trainer, config_path, config.train_overrides, str(work / "datasets"),
                    champion["dir"], target["dir"], str(out_dir), key, config.launcher, tracker=tracker)
    trained = {**trained, "dir": str(candidate_dir(Path(trained["dir"]), out_dir))}
    tracker.set_tags({"candidate_dir": trained["dir"], "cache_key": key})
    return trained


def candidate_dir(trained: Path, out_dir: Path) -> Path:
    """The candidate a (possibly cached) training result names. Prefect's cache is copied with a state
    dir, so in a copy a cached result names the original's candidate dir; the copy holds the same
    candidate at `out_dir` (same cache key), and that one is read, never the original's."""
    if not trained.is_relative_to(home.state_dir()) and (out_dir / "config.json").is_file():
        return out_dir
    return trained


def _shadow(config: FlywheelConfig, tracker: Any, work: Path, champion: dict, trained: dict,
            target: dict) -> dict[str, Any]:
    """The shadow summary for the registry (`draftwheel.registry.report_summary`, or `not_gated` for Medusa)
    and the gate's decision."""
    from draftwheel.registry import not_gated, report_summary

    if config.trainer == "medusa":
        print(MEDUSA_NOTE, flush=True)
        return {"summary": not_gated(MEDUSA_NOTE), "decision": {"promote": False, "reasons": [MEDUSA_NOTE]}}
    report_path = work / "shadow" / "report.json"
    # As served: the suffix index of the replay is built from the logs this round mined (a user's own
    # shadow_overrides may still name other logs).
    logs = [f"suffix_logs={config.logs_dir or home.logs_dir()}"]
    report = tasks.shadow_compare(champion["dir"], trained["dir"], target["dir"],
                                  str(home.mined_dataset("holdout", work / "datasets")), config.shadow_config,
                                  logs + list(config.shadow_overrides), str(report_path), tracker=tracker)
    from draftwheel.evaluation.gate import source_lines
    from draftwheel.training.common import read_training_info

    artifacts.publish_gate(report["decision"], report, f"challenger {Path(trained['dir']).name} vs champion "
                           f"v{champion['version']} (flywheel work dir {work})")
    for line in source_lines(report):  # how each as-served figure splits between index, draft and plain steps
        print(f"flywheel: steps as served (share x tokens each), {line}", flush=True)
    predicted = prediction_against_gate(read_training_info(trained["dir"]), report)
    if predicted:
        print("flywheel: training's probe predicted a mean accepted length of {walk_mal:.2f} alone (teacher-forced "
              "{implied_mal:.2f}); the gate measured {gate_alone_mal:.2f} alone, {gate_served_mal:.2f} as served "
              "(prediction gap {walk_gap:+.2f})".format(**predicted), flush=True)
        tracker.log_metrics({f"prediction.{k}": v for k, v in predicted.items()})
    return {"summary": report_summary(report, report_path), "decision": report["decision"], "prediction": predicted}


def prediction_against_gate(info: dict[str, Any], report: dict[str, Any]) -> dict[str, float] | None:
    """The challenger's training probe (the kept epoch: teacher-forced implied and serving's walk, with the
    chain cut) beside what the gate then measured of it (alone and as served), and the gap walk - alone:
    how far training's figure predicts serving's. None when either side lacks its figure (other trainers,
    a gate without draft-alone replays)."""
    metrics = info.get("metrics", {})
    challenger = report.get("overall", {}).get("challenger", {})
    alone = challenger.get("draft_alone", {}).get("mean_accepted_length")
    walk, implied = metrics.get("eval_served_mal"), metrics.get("eval_implied_mal")
    if walk is None or implied is None or alone is None:
        return None
    return {"implied_mal": float(implied), "walk_mal": float(walk), "gate_alone_mal": float(alone),
            "gate_served_mal": float(challenger["mean_accepted_length"]), "walk_gap": float(walk) - float(alone)}


def _register(config: FlywheelConfig, trained: dict, shadow: dict, mined: dict, champion: dict,
              target: dict) -> str:
    from draftwheel.registry import candidate_tags
    from draftwheel.serving.engine.models import draft_kind
    from draftwheel.serving.loading import target_tags
    from draftwheel.training.common import read_training_info

    tags = candidate_tags(read_training_info(trained["dir"]), target["sha256"],
                          **target_tags(config.target or target["dir"], target["sha256"], target["dir"]),
                          manifest_sha256=mined["sha256"],
                          stage=config.trainer if config.trainer in TRAINERS else None, trainer=config.trainer,
                          training_config=trained["config"], shadow_decision=shadow["decision"],
                          **{PARENT_TAG: champion["version"]})
    return tasks.register_candidate(trained["dir"], draft_kind(trained["dir"]), tags, shadow["summary"])


def _turn(config: FlywheelConfig, tracker: Any, work: Path) -> dict[str, Any]:
    """The stages in order; returns the flow's result. Raises StageError when one fails."""
    with stage(tracker, "resolve"):
        target = tasks.resolve_target(config.target, config.champion_uri)
        champion = tasks.resolve_champion(config.champion_uri)
        config = dataclasses.replace(config, trainer=trainer_for(config, champion["dir"]))
        shadow = _shadow_settings(config)
        config = dataclasses.replace(config, train_overrides=[*_probe_settings(config.trainer, shadow),
                                                              *config.train_overrides])
        tracker.log_params({"target": target["dir"], "champion_version": champion["version"],
                            "trainer": config.trainer})
    served = replay.served_slices(shadow)  # the canary set's slices: mining keeps replay of each
    focus = _focus_after(config)  # read once: every attempt of this round mines the same traffic
    if focus is not None:
        config = dataclasses.replace(config, mining_overrides=[override("focus_after", focus),
                                                               *config.mining_overrides])
        tracker.log_params({"focus_after": focus})
    attempts: list[dict[str, Any]] = []
    boost: dict[str, float] = {}
    trainers_rehearsal = _rehearsal_ratio(config)  # None when the trainer does not rehearse
    rehearsal = trainers_rehearsal  # this attempt's: a retry may raise it
    for number in range(1, config.max_retries + 2):
        attempt_work = work if number == 1 else work / f"attempt-{number}"
        raised = [f"rehearsal_ratio={rehearsal:g}"] if rehearsal != trainers_rehearsal else []
        attempt_config = dataclasses.replace(config, train_overrides=[*config.train_overrides, *raised])
        with tracker.run(f"attempt-{number}", nested=True,
                         tags={"replay_boost": json.dumps(boost), "train_overrides_added": " ".join(raised)}):
            result = _attempt(attempt_config, tracker, attempt_work, champion, target, served, boost)
        plan = replay.plan_retry(result["decision"], result["replay"], boost, config.retry_replay_boost, rehearsal)
        retry = plan.boost is not None and number <= config.max_retries
        attempts.append({"attempt": number, "replay_boost": boost, "rehearsal": rehearsal if raised else None,
                         "challenger_version": result["challenger_version"],
                         "decision": {k: result["decision"].get(k) for k in ("promote", "failed_checks",
                                                                             "blocking_slices")},
                         "next": f"retry: {plan.reason}" if retry else (
                             None if result["decision"]["promote"] else
                             f"stop: {plan.reason if plan.boost is None else 'max_retries reached'}")})
        if not retry:
            break
        boost, rehearsal = plan.boost, plan.rehearsal
    return {**result, "champion_before": champion["version"], **replay.attempts_report(attempts)}


def _require_new_traffic(manifest: dict[str, Any]) -> None:
    """A round that focuses on the traffic since the last round needs some: with none, it stops before
    training on nothing new (and the champion stays)."""
    from draftwheel.mining.config import format_time

    after = manifest.get("focus_after_ts")
    focus = sum(entry.get("train_pool", 0) for entry in manifest.get("slices", {}).values())
    if after is not None and not focus + manifest["counts"].get("holdout_window", 0):
        raise ValueError(f"no requests served since the last round mined (its newest was logged "
                         f"{format_time(after)}): "
                         "serve traffic first, or set focus_new_traffic=false to mine all the logs again")


def _focus_after(config: FlywheelConfig) -> float | None:
    """The newest request the last round mined, where this round's focus starts (None: mine all the logs)."""
    from draftwheel.mining.corpus import mined_until

    if not (config.corpus and config.focus_new_traffic):
        return None
    return mined_until(config.corpus_dir or home.state_dir() / "corpus")


def _rehearsal_ratio(config: FlywheelConfig) -> float | None:
    """The trainer's rehearsal_ratio when it rehearses (the built-in eagle trainer), else None: a retry's
    lever for blocking slices with no replay samples in the logs (`draftwheel.flows.replay.plan_retry`)."""
    if config.trainer not in TRAINERS:
        return None
    train = config.train_stage_config(config.trainer)
    ratio = getattr(train, "rehearsal_ratio", 0)
    return ratio if ratio > 0 and train.rehearsal else None


def _shadow_settings(config: FlywheelConfig) -> Any:
    """The shadow stage's config, as this round's gate will read it."""
    from draftwheel.evaluation.shadow import ShadowConfig

    return load_config(ShadowConfig, stage_config_path(config.shadow_config, "shadow") or None,
                       config.shadow_overrides)


# trainer probe field -> the shadow setting it must equal for the probe to measure what the gate replays
PROBE_FIELDS = {"eval_k": "k", "eval_min_path_prob": "min_path_prob"}


def _probe_settings(trainer: str, shadow: Any) -> list[str]:
    """Overrides that make `trainer`'s per-epoch probe walk the chains the gate replays (`shadow`, the shadow
    stage's config: its k and chain cut), for the probe fields the trainer has. They go before the round's
    own train_overrides, so a setting the user gives there still wins. A trainer outside draftwheel gets none."""
    if trainer not in TRAINERS:
        return []
    fields = {f.name for f in dataclasses.fields(TRAINERS[trainer].load()[0])}
    return [f"{name}={getattr(shadow, setting)}" for name, setting in PROBE_FIELDS.items() if name in fields]


def _attempt(config: FlywheelConfig, tracker: Any, work: Path, champion: dict, target: dict, served: list[str],
             boost: dict[str, float]) -> dict[str, Any]:
    """mine -> train -> shadow -> register -> promote once, with `boost` as mining's replay_boost."""
    mining_overrides = [override("replay_slices", served), *config.mining_overrides,
                        *([override("replay_boost", boost)] if boost else [])]
    with stage(tracker, "mine"):
        mined = tasks.mine_datasets(config.logs_dir or str(home.logs_dir()), str(work / "datasets"),
                                    config.mining_config, mining_overrides, target["dir"],
                                    config.corpus_policy(), config.corpus_dir or str(home.state_dir() / "corpus"))
        _require_new_traffic(mined["manifest"])
        tracker.log_params(mined["config"])
        counts = mined["manifest"].get("counts", {})
        tracker.log_metrics({k: v for k, v in counts.items() if isinstance(v, (int, float))})
        if mined["corpus"]:
            print(f"[corpus] rows per slice {mined['corpus']['sizes']}; {mined['corpus']['mixed']} rows of earlier "
                  f"rounds join this round's training set", flush=True)
            tracker.log_metrics({f"corpus.{name}": n for name, n in mined["corpus"]["sizes"].items()}
                                | {"corpus.mixed": mined["corpus"]["mixed"]})
        plot = mined["manifest"].get("outputs", {}).get("plot", {}).get("path")
        for path in [mined["path"]] + ([work / "datasets" / plot] if plot else []):
            tracker.log_artifact(path)
    with stage(tracker, "train"):
        trained = _train(config, tracker, work, mined, champion, target)
    with stage(tracker, "shadow"):
        shadow = _shadow(config, tracker, work, champion, trained, target)
    decision = shadow["decision"]
    with stage(tracker, "register"):
        version = _register(config, trained, shadow, mined, champion, target)
        tracker.set_tags({"challenger_version": version})
    promoted = bool(decision["promote"]) and config.promote
    with stage(tracker, "promote"):
        aliases = tasks.promote_version(version, target["sha256"], champion["version"]) if promoted else None
        tracker.set_tags({"promoted": str(promoted), "decision_reasons": "; ".join(decision["reasons"])[:5000]})
    return {"challenger_version": version, "promoted": promoted, "replay": mined["manifest"].get("replay", {}),
            "decision": decision, "aliases": aliases, "candidate_dir": trained["dir"],
            "manifest_path": mined["path"], "report_path": shadow["summary"].get("report", ""), "work_dir": str(work)}


def run_flywheel(config: FlywheelConfig) -> dict[str, Any]:
    """One turn under a parent MLflow run (the flow's body; callable without Prefect only inside a flow),
    after checking every stage's config, holding the state dir's `flywheel` lock."""
    config.check_stages()
    with state_lock("flywheel", purpose="draftwheel flywheel"):
        return _locked_run(config)


def _locked_run(config: FlywheelConfig) -> dict[str, Any]:
    from draftwheel.tracking import get_tracker

    tracker = get_tracker(config.tracking)
    work = run_dir(config)
    (work / "config.json").write_text(json.dumps(to_dict(config), indent=2))
    with tracker.run("flywheel", tags={"trainer": config.trainer}) as run_id:
        tracker.log_params({f"flywheel.{k}": v for k, v in to_dict(config).items()})
        try:
            result = _turn(config, tracker, work)
        except StageError as exc:
            tracker.set_tags({"failed_stage": exc.stage, "failure_reason": exc.reason})
            raise
        tracker.set_tags({"promoted": str(result["promoted"]), "challenger_version": result["challenger_version"],
                          "champion_before": result["champion_before"]})
        tracker.set_tags({"blocking_slices": ",".join(result["blocking_slices"]),
                          "attempts": str(len(result["attempts"]))})
        tracker.log_dict(result, "flywheel_result.json")
    result["mlflow_run_id"] = run_id
    (work / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(f"flywheel: challenger v{result['challenger_version']} "
          f"{'PROMOTED to champion' if result['promoted'] else 'not promoted'}: "
          f"{'; '.join(result['decision']['reasons'])}", flush=True)
    for line in result["tried"]:
        print(f"flywheel: {line}", flush=True)
    return result


@flow(name="flywheel")
def flywheel(config_path: str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """mine -> train -> shadow -> register -> promote, tracked in MLflow."""
    return run_flywheel(load_config(FlywheelConfig, config_path, overrides))
