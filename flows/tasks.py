"""Prefect tasks: thin wrappers around the stage functions, passing paths, URIs and small dicts.

Registry I/O gets retries (a sqlite lock or a remote MLflow hiccup is transient); training is cached
on its inputs (trainer, mined data sha256, config, starting draft, target), so re-running a flow
on unchanged data does not retrain. Each stage opens its MLflow run in the flow (see `draftwheel.flows.flywheel`);
the tasks themselves hold no state and never move tensors between them. Stage packages are imported
inside the tasks, so importing this module stays cheap.

No flow here uses Prefect's `log_prints`: its patched `print` bypasses the `sys.stdout` capture that
dill (used by `datasets` to hash functions) reads globals from, which floods the logs with bytecode.
Progress goes to stdout with plain prints; task states and durations are in the Prefect UI.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NONE

from draftwheel import home
from draftwheel.config import load_config, stage_config_path, to_dict
from draftwheel.hashing import file_sha256, tree_sha256
from draftwheel.registry_names import CHAMPION_URI
from draftwheel.training.trainers import TRAINERS  # built-ins; anything else is "package.module:function"

def is_transient(exc: BaseException | None) -> bool:
    """Registry failures worth retrying: the database or the transport failed. A missing model, version
    or alias, and corrupt artifacts, fail the same way on every try."""
    from draftwheel.tracking import ArtifactError, RegistryError

    if not isinstance(exc, RegistryError) or isinstance(exc, ArtifactError) or exc.__cause__ is None:
        return False
    return getattr(exc.__cause__, "error_code", "") != "RESOURCE_DOES_NOT_EXIST"


def _retry_registry(_task: Any, _task_run: Any, state: Any) -> bool:
    return is_transient(state.data if isinstance(state.data, BaseException) else None)


REGISTRY_RETRIES = dict(retries=3, retry_delay_seconds=2, retry_condition_fn=_retry_registry)


def datasets_sha256(root: str | Path, names: tuple[str, ...] = home.DATASET_KINDS) -> str:
    """sha256 of the mined datasets' contents (the manifest carries a timestamp, so it is not the key)."""
    return tree_sha256([Path(root) / name for name in names], root=root)


@task(name="resolve-target", cache_policy=NONE)
def resolve_target(spec: str, draft: str = CHAMPION_URI) -> dict[str, str]:
    """The target model dir and its weights sha256: `spec`, else the target the registry version `draft`
    names was trained for (`draftwheel.serving.loading.resolve_target`; the reference target with no champion)."""
    from draftwheel.serving.engine.models import weights_sha256
    from draftwheel.serving.loading import resolve_spec, resolve_target as target_spec

    path = resolve_spec(target_spec(spec, draft))
    return {"dir": str(path), "sha256": weights_sha256(path)}


@task(name="resolve-champion", cache_policy=NONE, **REGISTRY_RETRIES)
def resolve_champion(uri: str) -> dict[str, Any]:
    """Download (or find cached) the champion: its local dir, version, tags and weights sha256."""
    from draftwheel.tracking import resolve_model_uri
    from draftwheel.serving.engine.models import weights_sha256

    local_dir, version, tags = resolve_model_uri(uri)
    return {"uri": uri, "dir": str(local_dir), "version": version, "tags": tags,
            "sha256": weights_sha256(local_dir)}


@task(name="mine", cache_policy=NONE)
def mine_datasets(logs_dir: str, out_dir: str, config_path: str, overrides: list[str],
                  target_dir: str, corpus: Any = None, corpus_dir: str = "") -> dict[str, Any]:
    """Mine the serving logs into distill/preference/holdout datasets; return the manifest (+ its path).
    With a `corpus` policy (draftwheel.mining.corpus) the mined distill rows join the retained corpus at `corpus_dir`,
    and a sample of earlier rounds' rows joins the distill set (before the data's sha256 is taken)."""
    from draftwheel.mining import corpus as retained
    from draftwheel.mining.config import MiningConfig
    from draftwheel.mining.pipeline import mine

    config = load_config(MiningConfig, stage_config_path(config_path, "mining") or None, overrides)
    if config.tokenizer is None:  # the target's tokenizer decodes preference tokens, unless one is configured
        config = dataclasses.replace(config, tokenizer=target_dir)
    manifest = mine(Path(logs_dir), Path(out_dir), config)
    manifest_path = Path(out_dir) / "manifest.json"
    kept = None
    if corpus is not None:
        distill = Path(out_dir) / "distill"
        sizes = retained.retain(corpus_dir, distill, corpus, newest_ts=manifest.get("newest_ts"))
        kept = {"sizes": sizes, "mixed": retained.mix_into(distill, corpus_dir, corpus, seed=config.seed)}
    return {"manifest": manifest, "path": str(manifest_path), "sha256": file_sha256(manifest_path),
            "data_sha256": datasets_sha256(out_dir), "config": to_dict(config), "corpus": kept}


def train_cache_key(trainer: str, data_sha: str, config_path: str, overrides: list[str],
                    init_sha: str, target_sha: str) -> str:
    """Training's cache key: everything that determines the candidate (data and config by content)."""
    config_text = Path(config_path).read_text() if config_path else ""
    payload = json.dumps([trainer, data_sha, config_text, list(overrides), init_sha, target_sha])
    return hashlib.sha256(payload.encode()).hexdigest()


def _resolve_trainer(trainer: str):
    if trainer in TRAINERS:
        return TRAINERS[trainer].load()
    if ":" not in trainer:
        raise ValueError(f"trainer: {trainer!r} is not one of {', '.join(TRAINERS)} nor 'package.module:function'")
    module, fn = trainer.split(":", 1)
    return None, getattr(importlib.import_module(module), fn)


def stage_overrides(trainer: str, dataset_dir: str, init_dir: str, target_dir: str, out_dir: str) -> list[str]:
    """The overrides the flow supplies to a built-in trainer's config: data, start point, target, output."""
    spec = TRAINERS[trainer]
    overrides = [f"target={target_dir}", f"output_dir={out_dir}",
                 f"holdout={home.mined_dataset('holdout', dataset_dir)}",
                 f"dataset={home.mined_dataset(spec.dataset, dataset_dir)}"]
    return overrides + ([f"student={init_dir}"] if spec.student else [])  # medusa: heads on the frozen target


ACCELERATE_CLI = "accelerate.commands.accelerate_cli"
"""`accelerate` as a module: a launcher starting with `accelerate` runs under the flow's own interpreter."""


def launcher_argv(launcher: str) -> list[str]:
    """The launcher's words; `accelerate ...` becomes `<this python> -m accelerate.commands.accelerate_cli ...`,
    the accelerate installed beside the flow (and beside the trainers it starts), whatever PATH holds."""
    words = shlex.split(launcher)
    return [sys.executable, "-m", ACCELERATE_CLI, *words[1:]] if words[:1] == ["accelerate"] else words


def check_launcher(launcher: str) -> None:
    """Raise ValueError naming `launcher` for one that would not run what it says. `accelerate launch --cpu
    --num_processes N` starts N processes only through mpirun (`--mpirun_hostfile`); without it accelerate
    starts one process and trains alone, silently. Several processes on one machine: `--multi_gpu` (torchrun;
    on a machine without GPUs the processes train on its CPU, over gloo)."""
    try:
        words = shlex.split(launcher)
    except ValueError as exc:
        raise ValueError(f"launcher: cannot split {launcher!r} into words: {exc}") from exc
    if words[:2] != ["accelerate", "launch"]:
        return
    from accelerate.commands.launch import launch_command_parser

    try:
        args = launch_command_parser().parse_args([*words[2:], "-m", "draftwheel.training.trainers"])
    except SystemExit as exc:  # argparse has printed why
        raise ValueError(f"launcher: accelerate launch refuses {' '.join(words[2:])!r}") from exc
    if args.cpu and (args.num_processes or 1) > 1 and not args.mpirun_hostfile:
        raise ValueError(f"launcher: {launcher!r} would train in one process: accelerate's --cpu starts "
                         f"{args.num_processes} only through mpirun (--mpirun_hostfile). For several processes on "
                         "this machine use --multi_gpu --num_processes N (on a machine without GPUs they train "
                         "on the CPU over gloo)")


def launch_command(launcher: str, trainer: str, config_path: str, overrides: list[str]) -> list[str]:
    """`<launcher> -m <trainer module> [--config F] k=v ...`, e.g. with launcher "accelerate launch --multi_gpu
    --num_processes 4" (accelerate run by this interpreter: `launcher_argv`)."""
    module = TRAINERS[trainer].module
    return [*launcher_argv(launcher), "-m", module, *(["--config", config_path] if config_path else []), *overrides]


@task(name="train", cache_key_fn=lambda _ctx, params: params["cache_key"], persist_result=True)
def train_candidate(trainer: str, config_path: str, overrides: list[str], dataset_dir: str, init_dir: str,
                    target_dir: str, out_dir: str, cache_key: str, launcher: str = "",
                    tracker: Any = None) -> dict[str, Any]:
    """Train a candidate from the mined datasets, starting from the champion; return its dir and config.

    A built-in trainer gets its config from `config_path` + `overrides` + the flow's data/model paths and
    runs in-process, or under `launcher` as a subprocess (several processes: `accelerate launch ...`, each
    training on its shard of the data, rank 0 writing the candidate and the MLflow run). A custom
    trainer "package.module:function" is called as
    `function(config_path=, overrides=, dataset_dir=, init_dir=, target_dir=, out_dir=, tracker=) -> dir`.
    """
    config_cls, train_fn = _resolve_trainer(trainer)
    if config_cls is None:
        candidate = train_fn(config_path=config_path, overrides=list(overrides), dataset_dir=dataset_dir,
                             init_dir=init_dir, target_dir=target_dir, out_dir=out_dir, tracker=tracker)
        return {"dir": str(candidate), "config": {"trainer": trainer, "overrides": list(overrides)}}
    all_overrides = list(overrides) + stage_overrides(trainer, dataset_dir, init_dir, target_dir, out_dir)
    config = load_config(config_cls, config_path or None, all_overrides)
    if launcher:
        subprocess.run(launch_command(launcher, trainer, config_path, all_overrides), check=True)
        candidate = Path(out_dir)
    else:
        candidate = train_fn(config, tracker=tracker)
    return {"dir": str(candidate), "config": to_dict(config)}


@task(name="shadow", cache_policy=NONE)
def shadow_compare(champion_dir: str, challenger_dir: str, target_dir: str, holdout_dir: str,
                   config_path: str, overrides: list[str], report_path: str, tracker: Any = None) -> dict[str, Any]:
    """Replay the hold-out (+ canaries) through champion and challenger; the report carries the gate's decision.
    It is logged to `tracker`'s open run (the flywheel's shadow stage run)."""
    from draftwheel.evaluation.shadow import ShadowConfig, run_shadow

    config = load_config(ShadowConfig, stage_config_path(config_path, "shadow") or None, overrides)
    return run_shadow(champion_dir, challenger_dir, target_dir, holdout_dir, config, tracker=tracker,
                      out=report_path, own_run=False)


@task(name="register", cache_policy=NONE, **REGISTRY_RETRIES)
def register_candidate(model_dir: str, kind: str, tags: dict[str, Any], summary: dict[str, Any]) -> str:
    """Register the candidate with its kind and shadow summary (`draftwheel.registry.record_candidate`)."""
    from draftwheel.registry import record_candidate

    return record_candidate(model_dir, kind, tags, summary)


@task(name="promote", cache_policy=NONE, **REGISTRY_RETRIES)
def promote_version(version: str, target_sha: str | None = None, gated_against: str | None = None) -> dict[str, str]:
    """Make `version` the champion through `draftwheel.registry.promote` (checked, locked); return the aliases."""
    from draftwheel.registry import promote

    return promote(version, target_sha=target_sha, gated_against=gated_against)
