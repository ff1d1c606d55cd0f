"""Custom trainers ("package.module:function") for flow tests: deterministic stand-ins for training.

`copy_model` returns a copy of a prepared model dir (override `source=DIR`; `calls=FILE` logs each
call; `promote=VERSION` promotes VERSION meanwhile, as a concurrent promotion would), so a test decides
whether the candidate is better or worse than the champion; `broken` fails the way a crashed trainer does.
`replay_sensitive` stands for a trainer that forgets without enough replay: it returns `first=DIR` when the
mined mix has no replay boost, and `source=DIR` once the flywheel's retry boosted a slice's replay.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any


def copy_model(config_path: str, overrides: list[str], dataset_dir: str, init_dir: str, target_dir: str,
               out_dir: str, tracker: Any = None) -> Path:
    options = dict(item.split("=", 1) for item in overrides)
    assert (Path(dataset_dir) / "distill").is_dir(), "the flow must hand the trainer the mined datasets"
    shutil.copytree(options["source"], out_dir, dirs_exist_ok=True)
    if "calls" in options:  # a log of calls, so a test can tell a cached result from a new one
        with open(options["calls"], "a") as log:
            log.write(f"{out_dir}\n")
    if "promote" in options:  # another promotion landing while this round trains
        from tests.conftest import make_champion

        make_champion(options["promote"])
    return Path(out_dir)


def broken(config_path: str, overrides: list[str], dataset_dir: str, init_dir: str, target_dir: str,
           out_dir: str, tracker: Any = None) -> Path:
    raise RuntimeError("trainer ran out of memory (simulated)")


def replay_sensitive(config_path: str, overrides: list[str], dataset_dir: str, init_dir: str, target_dir: str,
                     out_dir: str, tracker: Any = None) -> Path:
    options = dict(item.split("=", 1) for item in overrides)
    boost = json.loads((Path(dataset_dir) / "manifest.json").read_text())["replay"]["boost"]
    chosen = options["source"] if boost else options["first"]
    return copy_model(config_path, [f"source={chosen}"], dataset_dir, init_dir, target_dir, out_dir, tracker)
