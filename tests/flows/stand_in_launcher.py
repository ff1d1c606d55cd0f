"""A stand-in for a trainer launcher (the flywheel's `launcher`, e.g. "accelerate launch"), for flow tests.

The flow runs `<launcher> -m training.MODULE [--config F] key=value ...`. With the launcher
`python tests/flows/stand_in_launcher.py --calls FILE --first DIR --then DIR`, each call appends the
module and the overrides it received to FILE (one JSON line) and, instead of training, copies a prepared
model dir to the `output_dir=` the flow set: `--then` when the overrides set `rehearsal_ratio` (what a
retry for slices with nothing to replay adds), else `--first`.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys


def main(argv: list[str]) -> int:
    split = argv.index("-m")
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", required=True)
    parser.add_argument("--first", required=True)
    parser.add_argument("--then", required=True)
    own = parser.parse_args(argv[:split])
    module, rest = argv[split + 1], argv[split + 2:]
    overrides = [item for item in rest if "=" in item and not item.startswith("-")]
    with open(own.calls, "a") as calls:
        calls.write(json.dumps({"module": module, "overrides": overrides}) + "\n")
    options = dict(item.split("=", 1) for item in overrides)
    source = own.then if "rehearsal_ratio" in options else own.first
    shutil.copytree(source, options["output_dir"], dirs_exist_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
