"""Mining throughput and memory on synthetic logs of realistic size: records/s and peak RSS, 100k vs 1M.

Generates logs with `mining.synthetic` (prompts of 100-400 tokens, outputs of 64-128 tokens built from
k=4 verification steps, ~7 KB a line; 0.1% broken lines, 1% prompts with an e-mail address), rotated
at 64 MiB like the serving sink, then runs `mining.pipeline.mine` with the default config (plus a toy tokenizer so
preference pairs and re-tokenisation run) in a fresh child process per size, so each peak RSS is that
run's alone. Prints records/s and peak RSS per size and the 1M/100k ratios; saves results/bench_mining.json.

    flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/bench_mining.py [--sizes 100000 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ROTATE_BYTES = 64 * 2**20  # serving.sink.JsonlSink's default max_bytes


def generate(logs: Path, n: int, seed: int = 0) -> float:
    """Write n records (+0.1% broken lines) as rotated sink-named files; returns seconds."""
    import msgspec

    from mining.synthetic import synthetic_record

    start = time.perf_counter()
    logs.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    encoder = msgspec.json.Encoder()
    handle, seq = None, 0
    for i in range(n):
        if handle is None or handle.tell() >= ROTATE_BYTES:
            if handle:
                handle.close()
            seq += 1
            handle = open(logs / f"acceptance.{seq:06d}.20261130T000000Z.jsonl", "wb", buffering=1 << 22)
        record = synthetic_record(rng, i, 1.7e9 + i * 0.05)
        if i % 100 == 0:
            record["prompt"] = record["prompt"].replace("task", f"from user{i}@example.com: task", 1)
        handle.write(encoder.encode(record) + b"\n")
        if i % 1000 == 999:
            handle.write(b'{"schema_version": 1, "request_id": "cut\n')
    handle.close()
    return time.perf_counter() - start


def child(logs: Path, out: Path, tokenizer: Path) -> None:
    """Run one mining pass and print its figures as JSON (in a fresh process: honest peak RSS)."""
    from mining.config import MiningConfig
    from mining.pipeline import mine

    config = MiningConfig(tokenizer=str(tokenizer))
    start = time.perf_counter()
    manifest = mine(logs, out, config)
    seconds = time.perf_counter() - start
    counts = manifest["counts"]
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime
    # Workers report their own peak (VmHWM after exec); ru_maxrss of a child would include the parent's
    # pages it shared between fork and exec.
    worker_peaks = manifest["scan_worker_peak_rss_mib"]
    print(json.dumps({
        "records": counts["kept"], "lines": counts["lines"], "quarantined": counts["quarantined"],
        "seconds": round(seconds, 2), "records_per_s": round(counts["kept"] / seconds),
        # CPU seconds of this process and its scan workers (imports included): the figure that does not
        # depend on how busy the shared machine was.
        "cpu_s": round(cpu, 2), "records_per_cpu_s": round(counts["kept"] / cpu),
        "scan_workers": manifest["scan_workers"], "log_files": len(manifest["inputs"]),
        "peak_rss_mib": round(own.ru_maxrss / 1024, 1), "worker_peak_rss_mib": max(worker_peaks, default=0.0),
        # Workers run at the same time as the parent: the sum of the peaks bounds the total.
        "peak_rss_total_mib": round(own.ru_maxrss / 1024 + sum(worker_peaks), 1),
        "load_avg_1m": os.getloadavg()[0],
        "log_bytes": sum(i["bytes"] for i in manifest["inputs"]), "timings": manifest["timings"],
        "outputs": {k: counts[k] for k in ("distill", "preference", "holdout")},
        "redactions": manifest["redactions"]["total"],
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--workdir", type=Path, default=ROOT / "results" / "tmp" / "bench_mining")
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "bench_mining.json")
    parser.add_argument("--keep", action="store_true", help="keep the generated logs")
    parser.add_argument("--child", nargs=3, type=Path, metavar=("LOGS", "OUT", "TOKENIZER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return
    from serving.toy import build_tokenizer

    tokenizer = args.workdir / "tokenizer"
    build_tokenizer().save_pretrained(tokenizer)
    runs = []
    for n in args.sizes:
        logs, out = args.workdir / f"n{n}" / "logs", args.workdir / f"n{n}" / "out"
        shutil.rmtree(args.workdir / f"n{n}", ignore_errors=True)
        gen_s = generate(logs, n)
        result = subprocess.run([sys.executable, __file__, "--child", str(logs), str(out), str(tokenizer)],
                                check=True, capture_output=True, text=True)
        run = {"size": n, "generate_s": round(gen_s, 1), **json.loads(result.stdout.strip().splitlines()[-1])}
        runs.append(run)
        print(f"{n:>9,} records: {run['records_per_s']:>8,} records/s wall ({run['records_per_cpu_s']:,} per CPU-s), "
              f"peak RSS {run['peak_rss_total_mib']:,.0f} MiB (parent {run['peak_rss_mib']:,.0f} + "
              f"{run['scan_workers']} x {run['worker_peak_rss_mib']:,.0f}), {run['log_bytes'] / 2**30:.2f} GiB of logs "
              f"in {run['seconds']} s, load {run['load_avg_1m']:.1f}  {run['timings']}", flush=True)
        if not args.keep:
            shutil.rmtree(logs)
    summary = {"runs": runs, "goal": {"records_per_s": 20_000, "peak_rss_total_mib": 1536},
               "command": "flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/bench_mining.py "
                          + " ".join(sys.argv[1:])}
    if len(runs) >= 2:
        small, large = runs[0], runs[-1]
        summary["size_ratio"] = large["size"] / small["size"]
        summary["rss_ratio"] = round(large["peak_rss_total_mib"] / small["peak_rss_total_mib"], 3)
        summary["throughput_ratio"] = round(large["records_per_s"] / small["records_per_s"], 3)
        print(f"{summary['size_ratio']:.0f}x the records: peak RSS x{summary['rss_ratio']}, "
              f"throughput x{summary['throughput_ratio']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
