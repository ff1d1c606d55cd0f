"""The `bootstrap` flow: the reference target and the v0 draft, registered as the first champion.

A Prefect wrapper around `training.bootstrap.bootstrap` (what `draftwheel bootstrap` runs), so a
fresh deployment can be brought up from the same scheduler as the rest of the loop. `needs_bootstrap`
tells whether there is a champion already; the demo uses it to skip this step on a second run.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.cache_policies import NONE


def needs_bootstrap(name: str | None = None) -> bool:
    """True when the registry has no `champion` (or no registered draft model at all)."""
    from draftwheel.tracking import DRAFT_MODEL, RegistryError, get_alias_version

    try:
        return get_alias_version("champion", name or DRAFT_MODEL) is None
    except RegistryError:
        return True


@task(name="bootstrap", cache_policy=NONE)
def bootstrap_task() -> dict[str, Any]:
    from training.bootstrap import bootstrap

    return bootstrap()


@flow(name="bootstrap", log_prints=True)
def bootstrap_flow(force: bool = False) -> dict[str, Any]:
    """Run `training.bootstrap.bootstrap` unless a champion exists (or `force`)."""
    if not force and not needs_bootstrap():
        print("bootstrap: a champion is registered already; nothing to do", flush=True)
        return {"skipped": True}
    print("\n=== bootstrap: reference target + v0 draft ===", flush=True)
    return bootstrap_task()
