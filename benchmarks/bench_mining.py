"""Mining throughput and memory on synthetic logs of realistic size: records/s and peak RSS, 100k vs 1M.

Generates logs with `draftwheel.mining.testing` (prompts of 100-400 tokens, outputs of 64-128 tokens built from
k=4 verification steps, ~7 KB a line; 0.1% broken lines, 1% prompts with an e-mail address), rotated
at 64 MiB like the serving sink, then runs `draftwheel.mining.pipeline.mine` with the default config (plus a toy
tokenizer so preference pairs and re-tokenisation run) in a fresh child process per size, so each peak
RSS is that run's alone. Prints records/s and peak RSS per size and the 1M/100k ratios.

    .venv/bin/python benchmarks/bench_mining.py [--sizes 100000 1000000]
The 1M-record logs take ~6 GiB under --workdir (default: a temporary dir in $DRAFTWHEEL_HOME, removed
afterwards). The JSON goes to --out (default $DRAFTWHEEL_HOME/benchmarks/bench_mining.json) and the
run to MLflow.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_io import add_output_arguments, save

ROTATE_BYTES = 64 * 2**20  # draftwheel.serving.engine.sink.JsonlSink's default max_bytes


def generate(logs: Path, n: int, seed: int = 0) -> float:
    """Write n records (+0.1% broken lines) as rotated sink-named files; returns seconds."""
    import msgspec

    from draftwheel.mining.testing import synthetic_record

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
    from draftwheel.mining.config import MiningConfig
    from draftwheel.mining.pipeline import mine

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="records per run")
    parser.add_argument("--workdir", type=Path, default=None,
                        help="where the logs and datasets go (default: a temporary dir in $DRAFTWHEEL_HOME)")
    parser.add_argument("--keep", action="store_true", help="keep the generated logs and datasets")
    add_output_arguments(parser, "bench_mining")
    parser.add_argument("--child", nargs=3, type=Path, metavar=("LOGS", "OUT", "TOKENIZER"), help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def run(sizes: list[int], workdir: Path, keep: bool) -> list[dict]:
    """Generate and mine each size in turn; one row of figures per size."""
    from draftwheel.serving.testing import build_tokenizer

    tokenizer = workdir / "tokenizer"
    build_tokenizer().save_pretrained(tokenizer)
    runs = []
    for n in sizes:
        logs, out = workdir / f"n{n}" / "logs", workdir / f"n{n}" / "out"
        shutil.rmtree(workdir / f"n{n}", ignore_errors=True)
        gen_s = generate(logs, n)
        result = subprocess.run([sys.executable, __file__, "--child", str(logs), str(out), str(tokenizer)],
                                check=True, capture_output=True, text=True)
        row = {"size": n, "generate_s": round(gen_s, 1), **json.loads(result.stdout.strip().splitlines()[-1])}
        runs.append(row)
        print(f"{n:>9,} records: {row['records_per_s']:>8,} records/s wall ({row['records_per_cpu_s']:,} per CPU-s), "
              f"peak RSS {row['peak_rss_total_mib']:,.0f} MiB (parent {row['peak_rss_mib']:,.0f} + "
              f"{row['scan_workers']} x {row['worker_peak_rss_mib']:,.0f}), {row['log_bytes'] / 2**30:.2f} GiB of logs "
              f"in {row['seconds']} s, load {row['load_avg_1m']:.1f}  {row['timings']}", flush=True)
        if not keep:
            shutil.rmtree(workdir / f"n{n}")
    return runs


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    if args.child:
        child(*args.child)
        return {}
    from draftwheel.home import state_dir

    if args.workdir:
        runs = run(args.sizes, args.workdir, args.keep)
    else:
        state_dir().mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="bench_mining-", dir=state_dir()))
        try:
            runs = run(args.sizes, workdir, args.keep)
        finally:
            if not args.keep:
                shutil.rmtree(workdir, ignore_errors=True)
    summary = {"runs": runs, "goal": {"records_per_s": 20_000, "peak_rss_total_mib": 1536},
               "command": "benchmarks/bench_mining.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    if len(runs) >= 2:
        small, large = runs[0], runs[-1]
        summary["size_ratio"] = large["size"] / small["size"]
        summary["rss_ratio"] = round(large["peak_rss_total_mib"] / small["peak_rss_total_mib"], 3)
        summary["throughput_ratio"] = round(large["records_per_s"] / small["records_per_s"], 3)
        print(f"{summary['size_ratio']:.0f}x the records: peak RSS x{summary['rss_ratio']}, "
              f"throughput x{summary['throughput_ratio']}")
    out = save("bench_mining", summary, args)
    print(f"wrote {out}")
    return summary


if __name__ == "__main__":
    main()
