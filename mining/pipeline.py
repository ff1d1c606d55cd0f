"""The mining stage: serving logs in, training/hold-out datasets and a manifest out.

`mine(logs_dir, out_dir, config)` runs: scan (validate every line, quarantine bad ones, filter by time
and slice, per-request stats into a compact on-disk index) -> select (hold-out by time, hard and
deep-rollback samples per slice with caps, uniform mix, replay of every served slice) -> curate (PII, exact and near dedupe, hold-out
isolation) -> write `distill/`, `preference/`, `holdout/`, `quarantine.jsonl`, the plot and
`manifest.json`. Memory is bounded by the caps in the config, not by the size of the logs: lines are
streamed, and only selected requests are read again. No training, no network, no Prefect.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from draftwheel.config import to_dict
from draftwheel.mining.config import MiningConfig
from draftwheel.mining.curate import Curated, curate, iter_records
from draftwheel.mining.outputs import DISTILL, HOLDOUT, PREFERENCE, DatasetWriter, TextPrep, distill_row, holdout_row, \
    path_sha256, preference_rows
from draftwheel.mining.pii import Scrubber
from draftwheel.mining.log_reader import list_log_files
from draftwheel.mining.first_pass import ScanResult, scan_pass
from draftwheel.mining.select import Selection, select
from draftwheel.mining.token_freq import token_table

MANIFEST_SCHEMA = "draftwheel.mining.manifest/v1"


def _load_tokenizer(path: str | None) -> Any:
    if path is None:
        return None
    if not Path(path).is_dir():
        raise FileNotFoundError(f"tokenizer: {path} is not a local tokenizer/model directory")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


class OutputDirError(OSError):
    """The output dir cannot be created or written; the message names it."""


def _prepare_out(out: Path) -> None:
    """Create `out` and check that it takes files before any work, so a bad path fails at once, by name."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryFile(dir=out).close()
    except OSError as exc:
        raise OutputDirError(f"out: cannot write to {out}: {exc.strerror or exc}") from exc


def write_outputs(files: list[Path], selection: Selection, curated: Curated, config: MiningConfig,
                  tokenizer: Any, out: Path, scratch: Path, replay_weights: dict[str, float] | None = None) -> dict[str, Any]:
    """Write the three datasets; returns rows and redaction counts per dataset. `replay_weights`: the
    `weight` of a replay sample by slice name (default `replay_weight`)."""
    preps = {name: TextPrep(Scrubber() if config.scrub_pii else None, tokenizer)
             for name in ("distill", "preference", "holdout")}
    writers = {"distill": DatasetWriter(DISTILL, scratch / "distill.arrow"),
               "preference": DatasetWriter(PREFERENCE, scratch / "preference.arrow"),
               "holdout": DatasetWriter(HOLDOUT, scratch / "holdout.arrow")}
    holdout_rows = selection.holdout[np.isin(selection.holdout["row"], curated.holdout)]
    counts = {"distill": Counter(), "holdout": Counter()}  # output-token frequencies (draftwheel.mining.token_freq)
    for _, record in iter_records(files, holdout_rows):
        row = holdout_row(record, preps["holdout"])
        writers["holdout"].add(row)
        counts["holdout"].update(row["output_token_ids"] if row else [])
    candidates = np.concatenate([rows for cat in selection.candidates.values() for rows in cat.values()]
                                + [selection.holdout[:0]])
    train_rows = candidates[np.isin(candidates["row"], list(curated.train))]
    weights = {"hard": config.hard_weight, "rollback": config.hard_weight, "uniform": config.uniform_weight}
    for row_id, record in iter_records(files, train_rows):
        category = curated.train[row_id]
        weight = ((replay_weights or {}).get(record.slice, config.replay_weight) if category == "replay"
                  else weights[category])
        row = distill_row(record, preps["distill"], weight)
        writers["distill"].add(row)
        counts["distill"].update(row["completion_token_ids"] if row else [])
        for pair in preference_rows(record, preps["preference"], config.max_pairs_per_request):
            writers["preference"].add(pair)
    written = {}
    for name, writer in writers.items():
        rows = writer.save(out / name)
        written[name] = {"rows": rows, "redactions": dict(preps[name].scrubber.counts) if config.scrub_pii else {},
                         "output_tokens": counts.get(name)}
    return written


def _slices_section(scan: ScanResult, selection: Selection, curated: Curated) -> dict[str, Any]:
    section = {}
    for name, slice_id in sorted(scan.slice_ids.items()):
        entry = scan.stats[name].to_dict()
        entry["train_pool"] = selection.train_counts.get(slice_id, 0)
        entry["quotas"] = selection.quotas.get(slice_id, {})
        entry["selected"] = dict(curated.kept.get(slice_id, {}))
        section[name] = entry
    return section


def replay_section(scan: ScanResult, curated: Curated, config: MiningConfig) -> dict[str, Any]:
    """What the replay share did: per served slice its quota, what was kept and the weight of its samples
    (up-weighted by quota/kept, at most `replay_max_upweight`, when its earlier traffic fell short), and
    the `replay_slices` that have no earlier traffic in the logs (`missing`)."""
    names = {slice_id: name for name, slice_id in scan.slice_ids.items()}
    slices = {}
    for slice_id, quota in sorted(curated.replay_quotas.items()):
        kept = curated.kept.get(slice_id, {}).get("replay", 0)
        factor = min(config.replay_max_upweight, quota / kept) if kept and quota > kept else 1.0
        slices[names[slice_id]] = {"quota": quota, "kept": kept, "weight": config.replay_weight * factor}
    return {"share": config.replay_share, "boost": dict(config.replay_boost), "slices": slices,
            "missing": sorted(set(config.replay_slices) - set(scan.slice_ids))}


def mine(logs_dir: str | Path, out_dir: str | Path, config: MiningConfig | None = None) -> dict[str, Any]:
    """Run the mining stage; returns the manifest (also written to `out_dir/manifest.json`)."""
    config = config or MiningConfig()
    out = Path(out_dir)
    files = list_log_files(logs_dir)
    tokenizer = _load_tokenizer(config.tokenizer)
    _prepare_out(out)
    timings = {}
    clock = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=out, prefix=".scratch-") as tmp:
        scratch = Path(tmp)
        vocab_size = len(tokenizer) if tokenizer is not None else None  # token ids are checked against it
        scan, index = scan_pass(files, scratch, out / "quarantine.jsonl", config, vocab_size)
        timings["scan_s"], clock = time.perf_counter() - clock, time.perf_counter()
        boost = {scan.slice_ids[name]: factor for name, factor in config.replay_boost.items() if name in scan.slice_ids}
        selection = select(index, scan.counts["kept"], scan.ts_range, config, boost)
        timings["select_s"], clock = time.perf_counter() - clock, time.perf_counter()
        curated = curate(files, selection, config, tokenizer is not None, boost)
        timings["curate_s"], clock = time.perf_counter() - clock, time.perf_counter()
        replay = replay_section(scan, curated, config)
        written = write_outputs(files, selection, curated, config, tokenizer, out, scratch,
                                {name: entry["weight"] for name, entry in replay["slices"].items()})
        timings["write_s"] = time.perf_counter() - clock
    outputs = {name: {"path": name, "rows": info["rows"], "sha256": path_sha256(out / name)}
               for name, info in written.items()}
    outputs["quarantine"] = {"path": "quarantine.jsonl", "rows": scan.counts["quarantined"],
                             "sha256": path_sha256(out / "quarantine.jsonl")}
    if config.plot:
        from draftwheel.mining.plots import plot_acceptance

        plot_acceptance(scan.stats, out / "acceptance_by_slice.png")
        outputs["plot"] = {"path": "acceptance_by_slice.png", "sha256": path_sha256(out / "acceptance_by_slice.png")}
    redactions = {name: info["redactions"] for name, info in written.items()}
    redactions["quarantine"] = dict(scan.quarantine_redactions)
    total: Counter[str] = Counter()
    for counts in redactions.values():
        total.update(counts)
    manifest = {
        "schema": MANIFEST_SCHEMA,
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "logs": str(logs_dir),
        "config": to_dict(config),
        "inputs": scan.inputs,
        "counts": {**dict(scan.counts), "holdout_window": selection.holdout_window,
                   "excluded_same_prompt_as_holdout": selection.excluded_holdout_keys,
                   "dropped": dict(curated.dropped), **{name: info["rows"] for name, info in written.items()}},
        "quarantine_by_kind": dict(scan.quarantine_kinds),
        "holdout_cutoff_ts": selection.cutoff if math.isfinite(selection.cutoff) else None,
        "newest_ts": scan.ts_range[1] if math.isfinite(scan.ts_range[1]) else None,
        "focus_after_ts": config.focus_after_ts,
        "preference_note": None if tokenizer is not None else "no tokenizer configured: preference/ is empty",
        "slices": _slices_section(scan, selection, curated),
        "replay": replay,
        "output_tokens": token_table(written["distill"]["output_tokens"], written["holdout"]["output_tokens"]),
        "redactions": {**redactions, "total": dict(total)},
        "outputs": outputs,
        "timings": {name: round(value, 3) for name, value in timings.items()},
        "scan_workers": max(1, len(scan.worker_peak_rss_mib)),
        "scan_worker_peak_rss_mib": scan.worker_peak_rss_mib,
    }
    _write_json(out / "manifest.json", manifest)
    return manifest


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write atomically: a reader never sees a half-written manifest."""
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)
