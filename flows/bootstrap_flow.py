"""The `bootstrap` flow: a target (`target` in its config, default the reference target) and its v0 draft,
registered as the first champion.

A Prefect wrapper around `draftwheel.training.bootstrap.bootstrap` (what `draftwheel bootstrap` runs), so a
fresh deployment can be brought up from the same scheduler as the rest of the loop. `needs_bootstrap`
tells whether there is a champion already; `v0_version` finds the draft bootstrap registered (the
demo starts from it). Building and registering are `draftwheel.training.bootstrap`'s business.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.cache_policies import NONE

from draftwheel.config import load_config


def needs_bootstrap() -> bool:
    """True when the registry has no `champion` (or no registered draft model at all)."""
    from draftwheel.registry_names import CHAMPION
    from draftwheel.tracking import RegistryError, get_alias_version

    try:
        return get_alias_version(CHAMPION) is None
    except RegistryError:
        return True


def v0_version() -> str | None:
    """The newest version registered by bootstrap (tag stage=bootstrap), if any."""
    from draftwheel.registry_names import STAGE_TAG
    from draftwheel.tracking import list_versions

    versions = [row["version"] for row in list_versions() if row["tags"].get(STAGE_TAG) == "bootstrap"]
    return versions[-1] if versions else None


def bootstrap_prompts(config_path: str | None = None) -> set[str]:
    """The prompts bootstrap trains the v0 draft on (its config's workload, size and seed), so that a
    caller can keep them out of anything it measures."""
    from draftwheel.config import stage_config_path
    from draftwheel.mining.workloads import build_workload
    from draftwheel.training.bootstrap import BootstrapConfig

    config = load_config(BootstrapConfig, stage_config_path(config_path or "", "bootstrap") or None)
    return {row["prompt"] for row in build_workload(config.workload, config.n_prompts + config.holdout_prompts,
                                                    config.seed)}


@task(name="bootstrap", cache_policy=NONE)
def bootstrap_task(config_path: str | None, overrides: list[str]) -> dict[str, Any]:
    from draftwheel.config import stage_config_path
    from draftwheel.training.bootstrap import BootstrapConfig, bootstrap

    return bootstrap(load_config(BootstrapConfig, stage_config_path(config_path or "", "bootstrap") or None, overrides))


@flow(name="bootstrap")
def bootstrap_flow(config_path: str | None = None, overrides: list[str] | None = None,
                   force: bool = False) -> dict[str, Any]:
    """Run `draftwheel.training.bootstrap.bootstrap` (config: `config_path`, default the shipped configs/bootstrap.yaml)
    unless a champion exists (or `force`)."""
    if not force and not needs_bootstrap():
        print("bootstrap: a champion is registered already; nothing to do", flush=True)
        return {"skipped": True}
    print("\n=== bootstrap: target + v0 draft ===", flush=True)
    return bootstrap_task(config_path, list(overrides or []))
