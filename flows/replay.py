"""The flywheel's replay policy: which slices a turn must keep in training, and when and how to retry.

- `served_slices(shadow)`: the slices the gate will weigh besides the mined hold-out's (the canary set's),
  handed to mining as `replay_slices` so each gets its replay share, or is reported as missing.
- `plan_retry(decision, replay, boost, factor, rehearsal)`: after a gate rejection on slice regressions
  alone (`failed_checks == ["slice"]`), the next attempt's mining `replay_boost`: the replay quota of the
  blocking slices that have replay samples in the logs, times `factor`. A blocking slice with none (only in
  the canary set, or every logged request of it already taken as a hard sample) can only be kept by the
  trainer's rehearsal of the data the champion learned from: its `rehearsal_ratio` is multiplied by
  `factor` too, where the trainer has one (`rehearsal`, else None). No retry (None, with the reason) when
  another check failed too, or when neither lever applies (more of nothing gives the same data).
- `attempts_report(attempts)`: the final report's summary: what blocked and what was tried.

Plain functions over the gate's decision dict and the manifest's `replay` section; running the stages is
`draftwheel.flows.flywheel`'s job.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def served_slices(shadow: Any) -> list[str]:
    """Slices of the canary set the shadow stage replays (none when `include_canary` is off)."""
    from draftwheel.evaluation.shadow import DEFAULT_CANARY, load_canary

    if not shadow.include_canary:
        return []
    return sorted({request.slice for request in load_canary(shadow.canary_path or DEFAULT_CANARY)})


@dataclass
class RetryPlan:
    boost: dict[str, float] | None
    """The next attempt's `replay_boost`, or None: no retry."""
    reason: str
    rehearsal: float | None = None
    """The next attempt's `rehearsal_ratio` (None: the trainer's own)."""


def plan_retry(decision: dict[str, Any], replay: dict[str, Any], boost: dict[str, float], factor: float,
               rehearsal: float | None = None) -> RetryPlan:
    """Whether another attempt can help, and with which replay boost and rehearsal (see the module
    docstring). `rehearsal`: this attempt's rehearsal_ratio, None when the trainer does not rehearse."""
    if decision.get("promote"):
        return RetryPlan(None, "promoted")
    failed = list(decision.get("failed_checks", []))
    if failed != ["slice"]:
        return RetryPlan(None, f"rejected on {', '.join(failed) or 'nothing named'}, not on slice regressions alone")
    blocking = list(decision.get("blocking_slices", []))
    replayable = [name for name in blocking if replay.get("slices", {}).get(name, {}).get("kept", 0) > 0]
    unreplayable = [name for name in blocking if name not in replayable]
    rehearse = bool(unreplayable) and bool(rehearsal)
    if not replayable and not rehearse:
        return RetryPlan(None, f"blocking slices {', '.join(blocking)} have no replay samples in the logs "
                               "and the trainer does not rehearse (serve some of that slice first)")
    new = {**boost, **{name: boost.get(name, 1.0) * factor for name in replayable}}
    levers = [f"replay x{factor:g} of {', '.join(replayable)}"] if replayable else []
    if rehearse:
        levers.append(f"rehearsal x{factor:g} (rehearsal_ratio {rehearsal:g} -> {rehearsal * factor:g}) for "
                      f"{', '.join(unreplayable)}, which have no replay samples in the logs")
    return RetryPlan(new, f"slice regression on {', '.join(blocking)}: {'; '.join(levers)}",
                     rehearsal * factor if rehearse else rehearsal)


def attempts_report(attempts: list[dict[str, Any]]) -> dict[str, Any]:
    """{"attempts": [...], "blocking_slices": of the last attempt, "tried": one line per attempt}."""
    tried = []
    for entry in attempts:
        decision = entry["decision"]
        boost = ", ".join([f"{k} x{v:g}" for k, v in entry["replay_boost"].items()]
                          + ([f"rehearsal_ratio {entry['rehearsal']:g}"] if entry.get("rehearsal") else [])
                          ) or "default replay share"
        verdict = "promote" if decision["promote"] else (
            f"rejected ({', '.join(decision.get('failed_checks', []))}"
            + (f"; blocking {', '.join(decision.get('blocking_slices', []))}" if decision.get("blocking_slices") else "")
            + ")")
        tried.append(f"attempt {entry['attempt']}: {boost} -> v{entry['challenger_version']} {verdict}"
                     + (f"; {entry['next']}" if entry.get("next") else ""))
    last = attempts[-1]["decision"] if attempts else {}
    return {"attempts": attempts, "blocking_slices": list(last.get("blocking_slices", [])), "tried": tried}
