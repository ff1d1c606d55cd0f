"""The one register / promote / rollback / status path, used by the command line and by the flows.

- `register_version` is the only way a version enters the registry (bootstrap, the flywheel and
  `draftwheel shadow` alike): it refuses a version that does not record its target's weights hash, tags
  every version with its kind, and registers it as an MLflow model that `mlflow.pyfunc.load_model` loads
  (`draftwheel.tracking.register_draft`).
- `record_candidate` registers a trained candidate with its provenance tags and the shadow summary
  (`shadow_report` is always the JSON of `report_summary`), and points `challenger` at it unless the gate
  rejected it; `record_shadow` does the same for a version that is registered already.
- `promote` refuses a version serving would refuse (files missing or corrupt, trained for another target or
  for none: `registry_names.trained_for`)
  and, when given the champion the candidate was gated against, a champion that moved since; `promote`
  and `rollback` move their aliases all or nothing, under the state dir's `registry` lock.
- `status_rows` lists every version of every registered model, including aliases that point at a
  version the registry no longer has, and versions whose files are gone, and the delivered gain the
  monitor recorded for a version (`record_delivered`).
- `last_rejection` finds the newest candidate the gate rejected against a given champion: the monitor
  waits for new traffic after it instead of training the same challenger again.

MLflow itself is only touched through `draftwheel.tracking`; models are never loaded here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from draftwheel import tracking
from draftwheel.locks import state_lock
from draftwheel.registry_names import (CHALLENGER, CHAMPION, DELIVERED_TAG, DRAFT_KIND_TAG, DRAFT_KINDS, DRAFT_MODEL,
                                       FILES_TAG, MANIFEST_TAG, PARENT_TAG, PREVIOUS, REGISTERED_MODELS,
                                       SHADOW_REPORT_TAG, STAGE_TAG, TARGET_SHA_TAG, TRAINING_CONFIG_TAG, WEIGHTS_TAG,
                                       model_for_kind, not_trained_for, trained_for, version_uri)

LOCK_WAIT_S = 60.0


class PromotionRefused(tracking.RegistryError):
    """The version may not become champion; the message says why."""


def _locked() -> Any:
    return state_lock("registry", LOCK_WAIT_S, "registry alias move")


def report_summary(report: dict[str, Any], report_path: str | Path | None = None) -> dict[str, Any]:
    """The compact form of a shadow report stored in the version's `shadow_report` tag."""
    overall = report["overall"]
    return {"promote": report["decision"]["promote"], "champion": report["champion"].get("version", ""),
            "n": overall["n"], "gain": overall["difference"], "champion_mal": overall["champion"]["mean"],
            "challenger_mal": overall["challenger"]["mean"], "lossless_mismatches": len(report["lossless"]["mismatches"]),
            "report": str(report_path or ""), "created": report.get("created", time.time())}


def not_gated(reason: str) -> dict[str, Any]:
    """The summary of a candidate no shadow run judged (e.g. Medusa heads): neither passed nor rejected."""
    return {"promote": False, "skipped": reason, "created": time.time()}


def candidate_tags(info: dict[str, Any], target_sha: str, **extra: Any) -> dict[str, Any]:
    """Provenance tags of a candidate: its target, and from its training info (`draftwheel_training.json`,
    read by the caller) the stage, config and dataset manifest; `extra` tags that are not None win."""
    tags = {TARGET_SHA_TAG: target_sha, MANIFEST_TAG: info.get("manifest_sha256", ""),
            STAGE_TAG: info.get("stage", ""), TRAINING_CONFIG_TAG: info.get("config", {})}
    return {**tags, **{k: v for k, v in extra.items() if v is not None}}


def _rejected(summary: dict[str, Any]) -> bool:
    return not summary["promote"] and "skipped" not in summary


def register_version(model_dir: str | Path, kind: str, tags: dict[str, Any]) -> str:
    """Register `model_dir` as a new version of the model its `kind` belongs to, tagged with `tags` and the
    kind; return the version. A version that does not say which target it was trained for is refused here:
    serving, promotion and hot reload would all refuse it later (`trained_for`)."""
    if kind not in DRAFT_KINDS:
        raise ValueError(f"kind: must be one of {', '.join(DRAFT_KINDS)}, got {kind!r}")
    if not tags.get(TARGET_SHA_TAG):
        raise ValueError(f"{TARGET_SHA_TAG}: {model_dir} is registered without the weights hash of the target it "
                         f"was trained for; no target could serve it")
    return tracking.register_draft(model_dir, {**tags, DRAFT_KIND_TAG: kind}, name=model_for_kind(kind))


def record_candidate(model_dir: str | Path, kind: str, tags: dict[str, Any], summary: dict[str, Any]) -> str:
    """Register `model_dir` (`register_version`) with `tags` and the shadow `summary`; point `challenger`
    at it unless the gate rejected it. Returns the version."""
    version = register_version(model_dir, kind, {**tags, SHADOW_REPORT_TAG: summary})
    name = model_for_kind(kind)
    if not _rejected(summary):
        with _locked():
            tracking.move_aliases({CHALLENGER: version}, name)
    return version


def record_shadow(version: str, summary: dict[str, Any], name: str = DRAFT_MODEL) -> None:
    """Tag a registered version with a shadow `summary`; point `challenger` at it unless rejected."""
    tracking.set_version_tags(version, {SHADOW_REPORT_TAG: summary}, name=name)
    if not _rejected(summary):
        with _locked():
            tracking.move_aliases({CHALLENGER: version}, name)


def record_delivered(version: str, gain: dict[str, Any], name: str = DRAFT_MODEL) -> None:
    """Tag `version` with the monitor's delivered gain (`draftwheel.flows.served.delivered_gain`)."""
    tracking.set_version_tags(version, {DELIVERED_TAG: gain}, name=name)


def previous_version(name: str = DRAFT_MODEL) -> str | None:
    """The version the `previous` alias points at (the champion before the current one), or None."""
    return tracking.get_alias_version(PREVIOUS, name)


def last_rejection(champion: str, name: str = DRAFT_MODEL) -> dict[str, Any] | None:
    """The newest shadow summary that rejected a candidate gated against version `champion` (with the
    rejected `version` added), or None: the monitor's sign that the logs it sees already trained a
    challenger that lost."""
    latest = None
    for v in tracking.list_versions(name):
        summary = _summary(v["tags"].get(SHADOW_REPORT_TAG, ""))
        if not summary or not _rejected(summary):
            continue
        # The flywheel tags the champion it trained from; a shadow run on a registry URI names it itself.
        gated_against = v["tags"].get(PARENT_TAG) or summary.get("champion")
        newer = latest is None or summary.get("created", 0) > latest.get("created", 0)
        if str(gated_against) == str(champion) and newer:
            latest = {**summary, "version": v["version"]}
    return latest


def _summary(raw: str) -> dict[str, Any] | None:
    """A `shadow_report` tag as a summary dict; None when absent or written by an older draftwheel."""
    try:
        summary = json.loads(raw) if raw else None
    except json.JSONDecodeError:
        return None
    return summary if isinstance(summary, dict) and "promote" in summary else None


def check_servable(version: str, name: str = DRAFT_MODEL, target_sha: str | None = None,
                   against_champion: bool = True) -> dict[str, str]:
    """Raise unless serving would load `version`: its files present and intact (downloaded and verified,
    which also warms serving's cache) and `trained_for` the target. The target is `target_sha` when given,
    else (with `against_champion`) the one the current champion was trained for; with neither, the version
    must still name a target. Returns its tags."""
    _, _, tags = tracking.resolve_model_uri(version_uri(version, name))  # ArtifactError when files are gone
    source = "the given target"
    if target_sha is None and against_champion:
        target_sha, source = _champion_target(version, name)
    if not trained_for(tags, target_sha):
        raise PromotionRefused(f"{name} version {version}: {not_trained_for(tags, target_sha, source)}; "
                               f"serving would refuse it")
    return tags


def _champion_target(version: str, name: str) -> tuple[str | None, str]:
    """(the target the current champion was trained for, how to name it); None when there is no other
    champion, or it names no target: then only the version's own tag is asked for."""
    champion = tracking.get_alias_version(CHAMPION, name)
    if champion is None or champion == version or not _exists(champion, name):
        return None, "the target"
    return tracking.get_version_tags(champion, name).get(TARGET_SHA_TAG) or None, \
        f"the champion (version {champion})'s target"


def _exists(version: str, name: str) -> bool:
    return any(row["version"] == version for row in tracking.list_versions(name))


def promote(version: str | int, name: str = DRAFT_MODEL, target_sha: str | None = None,
            gated_against: str | None = None) -> dict[str, str]:
    """`version` becomes champion and the old champion previous, all or nothing, after `check_servable`.

    `gated_against`: the champion version the candidate beat in shadow; if another promotion moved the
    champion since, refuse (the gate's verdict is about the old champion). Returns the new aliases.
    """
    version = str(version)
    check_servable(version, name, target_sha)
    with _locked():
        current = tracking.get_alias_version(CHAMPION, name)
        if gated_against is not None and current != gated_against:
            raise PromotionRefused(f"{name} version {version} was gated against champion version {gated_against}, "
                                   f"but the champion is now version {current} (another promotion ran "
                                   f"meanwhile); not promoting it: run the gate again")
        if current == version:
            return tracking.aliases(name)
        moves = {CHAMPION: version, **({PREVIOUS: current} if current and _exists(current, name) else {})}
        return tracking.move_aliases(moves, name)


def rollback(name: str = DRAFT_MODEL) -> dict[str, str]:
    """Swap champion and previous (a second rollback undoes the first), all or nothing."""
    with _locked():
        current = tracking.aliases(name)
        if PREVIOUS not in current:
            raise tracking.RegistryError(f"{name}: no 'previous' version to roll back to")
        champion = current.get(CHAMPION)
        if champion is not None and not _exists(champion, name):
            raise tracking.RegistryError(
                f"{name}: the champion alias points at version {champion}, which the registry does not have; "
                f"nothing moved. Choose the champion explicitly: draftwheel promote {current[PREVIOUS]}")
        # the previous champion served this target before: only its files and its target tag are checked
        check_servable(current[PREVIOUS], name, against_champion=False)
        return tracking.move_aliases({CHAMPION: current[PREVIOUS], PREVIOUS: champion}, name)


def _shadow_cell(raw: str) -> str:
    if not raw:
        return "-"
    shadow = _summary(raw)
    if shadow is None:  # written by an older draftwheel
        return f"report {raw}"
    if "skipped" in shadow:
        return "not gated"
    gain = shadow.get("gain") or {}
    return (f"{'pass' if shadow['promote'] else 'fail'} {gain.get('mean', 0):+.3f} "
            f"[{gain.get('ci_low', 0):+.3f},{gain.get('ci_high', 0):+.3f}] n={shadow.get('n', 0)}")


def _delivered_cell(raw: str) -> str:
    """Per slice: live mean accepted length as champion, its change against the previous champion and the
    change's confidence interval (absent in tags written before it was measured). Where the requests were
    served otherwise than by the draft alone (the hybrid), the figure over every step, as served, leads
    and the draft's own steps follow in brackets: what users got first."""
    try:
        gain = json.loads(raw) if raw else None
    except json.JSONDecodeError:
        gain = None
    if not isinstance(gain, dict) or not gain.get("slices"):
        return "-"
    cells = []
    for name, entry in gain["slices"].items():
        if name == "overall":
            continue
        change = "" if entry.get("mal_change") is None else f" {entry['mal_change']:+.0%}"
        if entry.get("mal_change_ci"):
            change += " [{:+.0%},{:+.0%}]".format(*entry["mal_change_ci"])
        alone = f"{entry['champion']['mean_accepted_length']:.2f}{change}"
        served = gain.get("as_served", {}).get(name)
        if served and served["champion"] != entry["champion"]:
            as_served = "" if served.get("mal_change") is None else f" {served['mal_change']:+.0%}"
            cells.append(f"{name} as served {served['champion']['mean_accepted_length']:.2f}{as_served} "
                         f"n={entry['champion']['requests']} (draft alone {alone})")
        else:
            cells.append(f"{name} {alone} n={entry['champion']['requests']}")
    return "; ".join(cells) or "-"


def _files_state(row: dict[str, Any]) -> str:
    """"ok", or "FILES MISSING" when a local artifact store lost the version's files (remote: "ok")."""
    try:
        source = urlparse(tracking.files_uri(row["source"], row["tags"]))
    except tracking.ArtifactError:
        return "FILES MISSING"
    if source.scheme != "file":
        return "ok"
    names = json.loads(row["tags"].get(FILES_TAG, "{}"))
    return "ok" if all((Path(source.path) / n).is_file() for n in names) else "FILES MISSING"


def status_rows(names: tuple[str, ...] = REGISTERED_MODELS) -> list[dict[str, str]]:
    """One row per version of each registered model (aliases, hashes, where it came from, the shadow
    verdict, whether its files are there), plus one per alias pointing at a version that is gone."""
    rows = []
    for name in names:
        versions = tracking.list_versions(name)
        for v in versions:
            tags = v["tags"]
            rows.append({
                "model": name, "version": v["version"], "aliases": ",".join(v["aliases"]) or "-",
                "created": time.strftime("%Y-%m-%d %H:%M", time.gmtime(v["created"])),
                "from": tags.get(STAGE_TAG) or tags.get("trainer") or "-",
                "weights": tags.get(WEIGHTS_TAG, "")[:12] or "-", "target": tags.get(TARGET_SHA_TAG, "")[:12] or "-",
                "shadow": _shadow_cell(tags.get(SHADOW_REPORT_TAG, "")),
                "delivered": _delivered_cell(tags.get(DELIVERED_TAG, "")), "state": _files_state(v)})
        known = {v["version"] for v in versions}
        dangling: dict[str, list[str]] = {}
        for alias, version in (tracking.aliases(name) if versions else {}).items():
            if version not in known:
                dangling.setdefault(version, []).append(alias)
        rows += [{"model": name, "version": version, "aliases": ",".join(sorted(aliases)), "created": "-",
                  "from": "-", "weights": "-", "target": "-", "shadow": "-", "delivered": "-",
                  "state": "VERSION MISSING"}
                 for version, aliases in sorted(dangling.items())]
    return rows


def format_table(rows: list[dict[str, str]]) -> str:
    if not rows:
        return "(no versions registered)"
    columns = list(rows[0])
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns).rstrip()]
    lines += ["  ".join(r[c].ljust(widths[c]) for c in columns).rstrip() for r in rows]
    return "\n".join(lines)
