"""The first pass of mining: every log line once -> quarantine, per-slice stats and the request index.

Files are split into contiguous groups scanned by worker processes (`python -m draftwheel.mining.first_pass JOB`:
fresh interpreters, so nothing is inherited by accident and callers need no `__main__` guard); each
writes its own index and quarantine part, and the parts are merged in file order, so the result is
identical whatever the number of workers. One group runs in-process. Per line: count a line over
the length limit (`scan_lines` quarantined it unread), skip blanks, validate (`draftwheel.serving.engine.records.read_record`, token ids against the vocabulary when it is known),
quarantine bad lines with their position, apply the
time and slice filters, skip requests the suffix tier served well (`skip_suffix_served_above`), compute the request's stats, and append one index row. Selection, text and
outputs are later stages' business.
"""

from __future__ import annotations

import math
import os
import pickle
import shutil
import subprocess
import sys
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from draftwheel.mining.config import MiningConfig
from draftwheel.mining.dedupe import exact_key
from draftwheel.mining.index import IndexFile
from draftwheel.mining.pii import Scrubber
from draftwheel.mining.log_reader import Quarantine, file_size, scan_lines
from draftwheel.mining.residual import served_share
from draftwheel.mining.stats import SliceStats, request_stats, suffix_served_length
from draftwheel.serving.engine.records import RecordError, read_record

AUTO_PARALLEL_BYTES = 256 * 2**20  # below this, starting workers costs more than it saves
MAX_WORKERS = 8


@dataclass
class ScanResult:
    counts: Counter[str] = field(default_factory=Counter)
    stats: dict[str, SliceStats] = field(default_factory=dict)
    slice_ids: dict[str, int] = field(default_factory=dict)
    inputs: list[dict[str, Any]] = field(default_factory=list)
    ts_range: tuple[float, float] = (math.inf, -math.inf)
    quarantine_kinds: Counter[str] = field(default_factory=Counter)
    quarantine_redactions: Counter[str] = field(default_factory=Counter)
    worker_peak_rss_mib: list[float] = field(default_factory=list)


def sample_key(request_id: str, seed: int) -> int:
    """Deterministic pseudo-random 32-bit key of a request: uniform samples take the smallest keys."""
    return zlib.crc32(request_id.encode("utf-8", "surrogatepass"), zlib.crc32(seed.to_bytes(8, "little")))


def scan_group(files: list[Path], first_file: int, scratch: Path, part: int, config: MiningConfig,
               vocab_size: int | None = None) -> ScanResult:
    """Scan `files` (global indices from `first_file`) into index/quarantine part `part` under `scratch`."""
    result = ScanResult()
    counts = result.counts
    since, until, wanted = config.since_ts, config.until_ts, set(config.slices)
    skip_suffix = config.skip_suffix_served_above
    lo, hi = math.inf, -math.inf
    index = IndexFile(scratch / f"index.{part}.bin")
    scrubber = Scrubber() if config.scrub_pii else None
    with Quarantine(scratch / f"quarantine.{part}.jsonl", scrubber, config.quarantine_max_chars) as quarantine:
        for file_index, path in enumerate(files, start=first_file):
            lines = 0
            for number, offset, line in scan_lines(path, quarantine):
                lines += 1
                if line is None:  # over the line-length limit: quarantined unread by scan_lines
                    continue
                if line.isspace():
                    counts["blank"] += 1
                    continue
                try:
                    record = read_record(line, vocab_size)
                except RecordError as exc:
                    if line.endswith(b"\n"):
                        quarantine.add(path, number, offset, exc.kind, str(exc), line)
                    else:
                        quarantine.add(path, number, offset, "truncated", f"truncated (no newline at end of file): {exc}",
                                       line)
                    continue
                if (since is not None and record.ts < since) or (until is not None and record.ts >= until):
                    counts["filtered_time"] += 1
                    continue
                if wanted and record.slice not in wanted:
                    counts["filtered_slice"] += 1
                    continue
                if skip_suffix is not None and suffix_served_length(record) > skip_suffix:
                    counts["filtered_suffix"] += 1
                    continue
                rate, _, depth, codes = request_stats(record)
                slice_id = result.slice_ids.get(record.slice)
                if slice_id is None:
                    slice_id = result.slice_ids[record.slice] = len(result.slice_ids)
                    result.stats[record.slice] = SliceStats()
                result.stats[record.slice].add(record, rate, depth, codes)
                hardness = served_share(record) if config.hard_by == "served" else rate  # selection ranks by this
                index.append((counts["kept"], file_index, number, offset, record.ts, slice_id, hardness, depth,
                              exact_key(record.prompt), sample_key(record.request_id, config.seed)))
                counts["kept"] += 1
                lo, hi = min(lo, record.ts), max(hi, record.ts)
            counts["lines"] += lines
            result.inputs.append({"path": str(path), "bytes": file_size(path), "lines": lines})
    index.close()
    counts["quarantined"] = quarantine.count
    result.quarantine_kinds = quarantine.kinds
    result.quarantine_redactions = scrubber.counts if scrubber else Counter()
    result.ts_range = (lo, hi)
    return result


def split_files(files: list[Path], groups: int) -> list[list[Path]]:
    """Contiguous groups of roughly equal bytes (order kept, so merged output is in file order)."""
    sizes = [file_size(p) for p in files]
    target = sum(sizes) / max(groups, 1)
    result: list[list[Path]] = [[]]
    acc = 0.0
    for path, size in zip(files, sizes):
        if result[-1] and acc >= target * len(result) and len(result) < groups:
            result.append([])
        result[-1].append(path)
        acc += size
    return [group for group in result if group]


def scan_workers(config: MiningConfig, files: list[Path]) -> int:
    """How many scan processes `config.workers` (0 = auto) gives for these files."""
    if config.workers:
        return max(1, min(config.workers, len(files)))
    if sum(file_size(p) for p in files) < AUTO_PARALLEL_BYTES:
        return 1
    return max(1, min(os.cpu_count() or 1, MAX_WORKERS, len(files)))


def scan_pass(files: list[Path], scratch: Path, quarantine_path: Path, config: MiningConfig,
              vocab_size: int | None = None) -> tuple[ScanResult, IndexFile]:
    """Scan all files (in parallel when worth it); returns the merged result and the merged index."""
    groups = split_files(files, scan_workers(config, files))
    starts = np.cumsum([0] + [len(g) for g in groups])[:-1].tolist()
    jobs = [(group, start, scratch, part, config, vocab_size) for part, (group, start) in enumerate(zip(groups, starts))]
    if len(jobs) <= 1:
        results = [scan_group(*job) for job in jobs] or [scan_group([], 0, scratch, 0, config, vocab_size)]
    else:
        results = _run_workers(jobs, scratch)
    return _merge(results, scratch, quarantine_path)


def _run_workers(jobs: list[tuple], scratch: Path) -> list[ScanResult]:
    """Run each job in its own `python -m draftwheel.mining.first_pass` process; results come back as pickles."""
    procs = []
    for part, job in enumerate(jobs):
        job_path = scratch / f"job.{part}.pkl"
        job_path.write_bytes(pickle.dumps(job))
        procs.append(subprocess.Popen([sys.executable, "-m", "draftwheel.mining.first_pass", str(job_path)],
                                      stderr=subprocess.PIPE))
    errors = [(part, proc.communicate()[1]) for part, proc in enumerate(procs)]
    failed = [(part, err) for (part, err), proc in zip(errors, procs) if proc.returncode != 0]
    if failed:
        part, err = failed[0]
        raise RuntimeError(f"scan worker {part} failed: {err.decode(errors='replace')[-2000:]}")
    return [pickle.loads((scratch / f"result.{part}.pkl").read_bytes()) for part in range(len(jobs))]


def peak_rss_mib() -> float | None:
    """This process's peak resident memory since its last exec (Linux VmHWM), in MiB.

    Unlike getrusage's ru_maxrss it does not carry over the parent's resident pages from before exec."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _worker_main(job_path: Path) -> None:
    job = pickle.loads(job_path.read_bytes())
    scratch, part = job[2], job[3]
    result = scan_group(*job)
    peak = peak_rss_mib()
    result.worker_peak_rss_mib = [round(peak, 1)] if peak is not None else []
    (scratch / f"result.{part}.pkl").write_bytes(pickle.dumps(result))


def _merge(parts: list[ScanResult], scratch: Path, quarantine_path: Path) -> tuple[ScanResult, IndexFile]:
    merged = ScanResult()
    index = IndexFile(scratch / "index.bin")
    with open(quarantine_path, "wb") as quarantine:
        for part_no, part in enumerate(parts):
            remap = np.zeros(max(len(part.slice_ids), 1), dtype=np.uint16)
            for name, local in part.slice_ids.items():
                if name not in merged.slice_ids:
                    merged.slice_ids[name] = len(merged.slice_ids)
                    merged.stats[name] = SliceStats()
                remap[local] = merged.slice_ids[name]
                merged.stats[name].merge(part.stats[name])
            offset = merged.counts["kept"]
            for chunk in IndexFile(scratch / f"index.{part_no}.bin", write=False).chunks():
                chunk["row"] += offset
                chunk["slice"] = remap[chunk["slice"]]
                index.append_rows(chunk)
            with open(scratch / f"quarantine.{part_no}.jsonl", "rb") as source:
                shutil.copyfileobj(source, quarantine)
            merged.counts.update(part.counts)
            merged.inputs += part.inputs
            merged.quarantine_kinds.update(part.quarantine_kinds)
            merged.quarantine_redactions.update(part.quarantine_redactions)
            merged.worker_peak_rss_mib += part.worker_peak_rss_mib
            merged.ts_range = (min(merged.ts_range[0], part.ts_range[0]), max(merged.ts_range[1], part.ts_range[1]))
    if len(merged.slice_ids) >= 0xFFFF:
        raise ValueError("more than 65534 distinct slices; restrict them with the `slices` filter")
    index.close()
    return merged, index


if __name__ == "__main__":
    # Import by name so pickled classes belong to `draftwheel.mining.first_pass`, not to `__main__`.
    from draftwheel.mining.first_pass import _worker_main as worker_main

    worker_main(Path(sys.argv[1]))
