"""The `monitor` flow: watch served acceptance and start the flywheel when the champion falls behind.

It reads the most recent acceptance records from the serving logs and triggers `flywheel` when
(a) as served, the mean accepted length over every step of the champion's recent requests (suffix
index, draft and plain steps: what users get), overall or on one slice, is below its threshold, (b) the
draft's own acceptance rate over a window of recent requests, overall or on one slice, is below its
threshold, or (c) the target's weights sha256 no longer matches the one the champion was trained for.
After a round whose challenger the gate rejected against the current champion, it holds the trigger
until `retrigger_after_requests` requests were served with the champion since that verdict (drafted or
not: any served request is traffic the next round can mine): on the same logs the
flywheel would train the same challenger again (measured on a shift to code: a second round on 40 more
requests gained +1.9 % [-3.6 %, +6.7 %] and was rejected, 9.7 minutes of CPU for nothing).
It also reports the delivered gain: the champion's live acceptance rate and mean accepted length per
slice against the previous champion's (records carry `draft_id.version`), logged to an MLflow run
`monitor` and stored on the champion's registry version, where `draftwheel status` shows it. The verdict is
a Prefect artifact of the flow run (`draftwheel-monitor`).
The decision logic is plain functions (`windows`, `acceptance_by_slice`, `decide`) tested without
Prefect; the flow only gathers inputs, decides and calls the flywheel. It never trains or promotes by
itself.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from prefect import flow

from draftwheel import home
from draftwheel.config import load_config
from draftwheel.registry_names import CHAMPION_URI, TARGET_SHA_TAG
from draftwheel.flows import artifacts, tasks
from draftwheel.flows.flywheel import FlywheelConfig, flywheel
from draftwheel.flows.served import (DRAFTING_MODES, SliceStats, VersionTally, acceptance_by_slice, delivered_gain,
                          delivered_metrics, is_drafted)
from draftwheel.serving.engine.records import AcceptanceRecord
from draftwheel.serving.engine.sink import log_files, valid_records


@dataclass
class MonitorConfig:
    """When the monitor triggers the flywheel."""

    logs_dir: str = ""
    """Serving log dir to read ("" = the state dir's logs/)."""
    window_requests: int = 64
    """Look at (at most) this many most recent drafted requests."""
    window_seconds: float = 0.0
    """Also ignore records older than this many seconds (0 = no age limit)."""
    min_requests: int = 16
    """Fewer records than this in the window (overall, or in a slice) is too little evidence to act on."""
    min_served_mal: float = 1.3
    """Trigger when a slice's mean accepted length as served is below this: over every step of the
    champion's latest requests (suffix-index, draft and plain steps), what users get. Checked first.
    Under 1.3 tokens a verify step, the hybrid is barely faster than plain decoding (0 = off)."""
    slice_min_served_mal: dict = field(default_factory=dict)
    """Per-slice thresholds overriding `min_served_mal`, e.g. {chat: 1.5}."""
    min_acceptance: float = 0.5
    """Trigger when the window's acceptance rate (accepted / drafted tokens) is below this."""
    slice_min_acceptance: dict = field(default_factory=dict)
    """Per-slice thresholds overriding `min_acceptance`, e.g. {code: 0.4}."""
    per_slice: bool = True
    """Also check each slice on its own (a shift on one slice can hide in the overall rate)."""
    champion_only: bool = True
    """Only count records whose draft weights sha256 is the current champion's (older ones are history)."""
    check_target_sha: bool = True
    """Trigger when the target's weights sha256 differs from the champion's `target_sha256` tag."""
    target: str = ""
    """Target model dir whose weights are checked ("" = the one the champion was trained for, as the registry
    recorded it; with no champion, the reference target in the state dir)."""
    champion_uri: str = CHAMPION_URI
    retrigger_after_requests: int = 32
    """After a rejected round against this champion, trigger again only once this many requests were
    served with it since the verdict, drafted or not (at most `window_requests`, all the monitor reads):
    new evidence, not the same logs again (0 = no hold)."""
    run_flywheel: bool = True
    """Start the flywheel when triggered (False = only report)."""
    flywheel_config: str = ""
    """Flywheel config file for the triggered run ("" = defaults)."""
    flywheel_overrides: list[str] = field(default_factory=list)
    delivered_gain: bool = True
    """Report the champion's live figures per slice against the previous champion's and tag its version."""
    delivered_confidence: float = 0.95
    """Two-sided level of the delivered change's bootstrap interval (draftwheel.flows.served.mal_change_interval)."""
    tracking: bool = True
    """Log the delivered gain to an MLflow run `monitor`."""

    def __post_init__(self) -> None:
        if self.window_requests < 1:
            raise ValueError(f"window_requests must be >= 1, got {self.window_requests}")
        if self.window_seconds < 0:
            raise ValueError(f"window_seconds must be >= 0, got {self.window_seconds}")
        if not 1 <= self.min_requests <= self.window_requests:
            raise ValueError(f"min_requests must be in 1..window_requests, got {self.min_requests}")
        if not 0.0 < self.delivered_confidence < 1.0:
            raise ValueError(f"delivered_confidence must be in (0, 1), got {self.delivered_confidence!r}")
        if self.retrigger_after_requests < 0:
            raise ValueError(f"retrigger_after_requests must be >= 0, got {self.retrigger_after_requests}")
        for label, value in _thresholds("min_served_mal", self.min_served_mal, self.slice_min_served_mal):
            if not isinstance(value, (int, float)) or not 0.0 <= value < float("inf"):
                raise ValueError(f"{label} must be a finite number >= 0, got {value!r}")
        for label, value in _thresholds("min_acceptance", self.min_acceptance, self.slice_min_acceptance):
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise ValueError(f"{label} must be a number in [0, 1], got {value!r}")

    def triggered_overrides(self) -> list[str]:
        """The triggered flywheel mines the logs the monitor watched, unless its own overrides say otherwise."""
        return ([f"logs_dir={self.logs_dir}"] if self.logs_dir else []) + list(self.flywheel_overrides)

    def check_stages(self) -> None:
        """Check the flywheel this monitor would start, and its stages' configs, now rather than when triggered."""
        if self.run_flywheel:
            load_config(FlywheelConfig, self.flywheel_config or None, self.triggered_overrides()).check_stages()


def _thresholds(field_name: str, default: Any, per_slice: dict) -> list[tuple[str, Any]]:
    """(label, value) of a threshold and its per-slice overrides, labelled as a config error names them."""
    return [(field_name, default), *((f"slice_{field_name}.{name}", value) for name, value in per_slice.items())]


@dataclass
class MonitorDecision:
    trigger: bool
    reasons: list[str]
    stats: dict[str, SliceStats]
    """Keyed by slice, plus "overall"."""
    held: str = ""
    """Why reasons that would trigger did not (a rejected round on the same evidence); "" = not held."""
    served: dict[str, SliceStats] = field(default_factory=dict)
    """As served: every step of the champion's latest requests, keyed by slice, plus "overall"."""

    def summary(self) -> dict:
        return {
            "trigger": self.trigger, "reasons": self.reasons, "held": self.held,
            "served_mal": {k: round(s.mean_accepted_length, 4) for k, s in self.served.items()},
            "served_requests": {k: s.requests for k, s in self.served.items()},
            "acceptance": {k: round(s.acceptance_rate, 4) for k, s in self.stats.items()},
            "requests": {k: s.requests for k, s in self.stats.items()},
        }


def windows(records: Iterable[AcceptanceRecord], config: MonitorConfig, now: float | None = None,
            champion_sha: str | None = None) -> tuple[list[AcceptanceRecord], list[AcceptanceRecord]]:
    """In one pass, oldest first, each bounded by count and age (memory stays O(window)):
    - the most recent records that say something about the draft: drafted ones, and hybrid ones the
      step pace served with plain steps (`paced_out`);
    - the most recent records served with a draft (any drafting mode, whatever drafted their steps):
      the as-served window."""
    now = time.time() if now is None else now
    drafted: list[tuple[float, int, AcceptanceRecord]] = []
    served: list[tuple[float, int, AcceptanceRecord]] = []

    def push(heap: list, item: tuple[float, int, AcceptanceRecord]) -> None:
        (heapq.heappush if len(heap) < config.window_requests else heapq.heappushpop)(heap, item)

    for seq, record in enumerate(records):
        draft_sha = record.draft_id.sha256 if record.draft_id else None
        if config.champion_only and champion_sha and draft_sha != champion_sha:
            continue
        if config.window_seconds > 0 and now - record.ts > config.window_seconds:
            continue
        if record.mode in DRAFTING_MODES and record.draft_id is not None:
            push(served, (record.ts, seq, record))
        if is_drafted(record) or paced_out(record):
            push(drafted, (record.ts, seq, record))
    return [r for *_, r in sorted(drafted)], [r for *_, r in sorted(served)]


def window(records: Iterable[AcceptanceRecord], config: MonitorConfig, now: float | None = None,
           champion_sha: str | None = None) -> list[AcceptanceRecord]:
    """The first of `windows`: the most recent records that say something about the draft."""
    return windows(records, config, now, champion_sha)[0]


def paced_out(record: AcceptanceRecord) -> bool:
    """A hybrid request that took plain steps before its last token: the step pace found drafting did not
    pay there and the suffix index had nothing (draftwheel.serving.engine.adaptive.StepPace). Under serving's default mode
    that is how a draft that fails on a slice shows: few drafted tokens, mostly rejected, many plain steps.
    A request the index served entirely says nothing about the draft and does not count."""
    return record.mode == "hybrid" and any(not step.k for step in record.steps[:-1])


def decide(records: list[AcceptanceRecord], config: MonitorConfig,
           target_sha: str | None = None, champion_target_sha: str | None = None,
           rejection: dict[str, Any] | None = None,
           served_records: list[AcceptanceRecord] | None = None) -> MonitorDecision:
    """Trigger on low acceptance (overall / per slice, with enough evidence) or a changed target. Low
    acceptance is held when `rejection` (`draftwheel.registry.last_rejection` for this champion) is newer
    than all but fewer than `retrigger_after_requests` of the served window's records (`served_records`,
    else `records`): a request the index served alone is new traffic too. A changed target always
    triggers: the rejected round trained for the old one."""
    stats = acceptance_by_slice(records)
    served = acceptance_by_slice(served_records or [], every_step=True)
    reasons = []
    target_changed = bool(config.check_target_sha and target_sha and champion_target_sha
                          and target_sha != champion_target_sha)
    if target_changed:
        reasons.append(f"target weights changed: sha256 {target_sha[:12]} != champion's {champion_target_sha[:12]}")
    for name, entry in served.items():  # what users get, first
        if name != "overall" and not config.per_slice:
            continue
        floor = config.slice_min_served_mal.get(name, config.min_served_mal)
        if entry.requests >= config.min_requests and entry.mean_accepted_length < floor:
            reasons.append(f"as served: mean accepted length {entry.mean_accepted_length:.2f} < {floor} on {name} "
                           f"over the last {entry.requests} requests")
    for name, entry in stats.items():
        if name != "overall" and not config.per_slice:
            continue
        threshold = config.slice_min_acceptance.get(name, config.min_acceptance)
        # no drafted token at all says nothing about the draft (the index served every step)
        if entry.requests >= config.min_requests and entry.drafted and entry.acceptance_rate < threshold:
            reasons.append(f"acceptance {entry.acceptance_rate:.3f} < {threshold} on {name} "
                           f"over the last {entry.requests} requests")
    held = ""
    if reasons and rejection and not target_changed:
        since = sum(record.ts > rejection["created"] for record in served_records or records)
        needed = min(config.retrigger_after_requests, config.window_requests)
        if since < needed:
            held = (f"v{rejection['version']} was rejected against this champion "
                    f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime(rejection['created']))} UTC; "
                    f"{since} of {needed} new requests served since")
    return MonitorDecision(trigger=bool(reasons) and not held, reasons=reasons, stats=stats, held=held, served=served)


def read_records(logs_dir: str | Path) -> Iterator[AcceptanceRecord]:
    """Valid records under `logs_dir`, in write order. Bad lines are skipped here: quarantining them is
    mining's job, the monitor only reads."""
    return valid_records(log_files(logs_dir))


@flow(name="monitor")
def monitor(config_path: str | None = None, overrides: list[str] | None = None) -> dict[str, Any]:
    """Check recent acceptance and the target's hash; run the flywheel when either says so."""
    return run_monitor(load_config(MonitorConfig, config_path, overrides))


def run_monitor(config: MonitorConfig) -> dict[str, Any]:
    """The monitor flow's body: gather inputs, decide, maybe run the flywheel (as a subflow)."""
    from draftwheel import registry, tracking

    champion = tasks.resolve_champion(config.champion_uri)
    target_sha = tasks.resolve_target(config.target, config.champion_uri)["sha256"] if config.check_target_sha else None
    logs_dir = config.logs_dir or str(home.logs_dir())
    name = tracking.parse_model_uri(config.champion_uri)[0]
    previous = registry.previous_version(name) if config.delivered_gain else None
    tally = VersionTally(name, [champion["version"], *([previous] if previous else [])])
    records, served = windows(tally.watch(read_records(logs_dir)), config, champion_sha=champion["sha256"])
    rejection = registry.last_rejection(champion["version"], name) if config.retrigger_after_requests else None
    decision = decide(records, config, target_sha, champion["tags"].get(TARGET_SHA_TAG), rejection, served)
    mals = ", ".join(f"{k} {s.mean_accepted_length:.2f} (n={s.requests})" for k, s in decision.served.items()
                     if s.requests)
    rates = ", ".join(f"{k} {s.acceptance_rate:.3f} (n={s.requests})" for k, s in decision.stats.items())
    print(f"monitor: champion v{champion['version']}, as served mean accepted length {mals or '-'}; "
          f"draft acceptance {rates}", flush=True)
    if decision.held:
        print(f"monitor: HELD ({'; '.join(decision.reasons)}): {decision.held}", flush=True)
    else:
        print(f"monitor: {'TRIGGER: ' + '; '.join(decision.reasons) if decision.trigger else 'no trigger'}", flush=True)
    artifacts.publish_monitor(decision.summary(), champion["version"])
    result: dict[str, Any] = {"decision": decision.summary(), "champion_version": champion["version"], "flywheel": None,
                              "delivered": _delivered(config, tally, champion["version"], previous, name)}
    if decision.trigger and config.run_flywheel:
        result["flywheel"] = flywheel(config.flywheel_config or None, config.triggered_overrides())
    return result


def _interval(entry: dict[str, Any]) -> str:
    return " [{:+.1%}, {:+.1%}]".format(*entry["mal_change_ci"]) if entry.get("mal_change_ci") else ""


def _delivered(config: MonitorConfig, tally: VersionTally, champion: str, previous: str | None,
               name: str) -> dict[str, Any] | None:
    """The delivered gain: printed, logged to an MLflow run `monitor`, stored on the champion's version."""
    from draftwheel import registry
    from draftwheel.tracking import get_tracker

    if not config.delivered_gain:
        return None
    gain = delivered_gain(tally, champion, previous, config.delivered_confidence)

    def change(entry: dict[str, Any]) -> str:
        return "" if entry["mal_change"] is None else f" ({entry['mal_change']:+.1%}{_interval(entry)} vs v{previous})"

    for slice_name, entry in gain["slices"].items():
        print(f"monitor: delivered v{champion} {slice_name}: mean accepted length "
              f"{entry['champion']['mean_accepted_length']:.3f}{change(entry)}, acceptance "
              f"{entry['champion']['acceptance_rate']:.3f}, n={entry['champion']['requests']}", flush=True)
    for slice_name, entry in gain["as_served"].items():
        own = gain["slices"].get(slice_name, {})
        if (entry["champion"], entry["previous"]) != (own.get("champion"), own.get("previous")):  # hybrid traffic
            print(f"monitor: delivered v{champion} {slice_name} as served (every step, the suffix index's and plain "
                  f"ones too): mean accepted length {entry['champion']['mean_accepted_length']:.3f}{change(entry)}, "
                  f"n={entry['champion']['requests']}", flush=True)
    if gain["slices"] or gain["as_served"]:  # a champion that served nothing yet keeps its last figures
        tracker = get_tracker(config.tracking)
        tags = {"champion_version": champion, "previous_version": str(previous or "")}
        with tracker.run("monitor", nested=True, tags=tags):
            tracker.log_metrics(delivered_metrics(gain))
            tracker.log_dict(gain, "delivered_gain.json")
        registry.record_delivered(champion, gain, name=name)
    return gain
