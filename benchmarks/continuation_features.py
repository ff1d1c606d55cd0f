"""The eagle round's data step, two ways, on the same mined dataset in one run: target continuations of the
cut outputs and then a teacher-forced feature forward over every sequence (before), vs continuations
that keep generation's hidden states as the continued sequences' features (`training.eagle_train.lengthen`
now), plus a forward over the rest. Prints both times, their ratio and how close the features are.

    flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/continuation_features.py \\
        --dataset <flywheel run>/datasets/distill
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch

from draftwheel.config import load_config
from draftwheel.home import apply_offline_defaults
from serving.eagle import default_aux_layer_ids
from serving.engine import eos_token_ids
from serving.models import load_model
from serving.reference import default_target_dir
from training import eagle_train
from training.eagle_features import compute_features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="a mined distill/ dataset dir")
    parser.add_argument("--target", default=None, help="target model dir (default: the reference target)")
    args = parser.parse_args()
    apply_offline_defaults()
    config = load_config(eagle_train.EagleConfig, str(Path(__file__).parents[1] / "configs/eagle.yaml"), [])
    target = load_model(args.target or str(default_target_dir()))
    eos = eos_token_ids(target)
    aux = default_aux_layer_ids(target.model.config.num_hidden_layers)

    def timed(fn):
        start = time.perf_counter()
        return fn(), time.perf_counter() - start

    before = eagle_train.load_sequences(Path(args.dataset), config.max_length)
    (_, _), t_continue = timed(lambda: eagle_train.lengthen(before, target, eos, config, Path(tempfile.mkdtemp()), None))
    old, t_forward = timed(lambda: compute_features(target.model, before.ids, aux, progress=False))
    now = eagle_train.load_sequences(Path(args.dataset), config.max_length)
    (info, rows), t_lengthen = timed(lambda: eagle_train.lengthen(now, target, eos, config,
                                                                  Path(tempfile.mkdtemp()), aux))
    new, t_rest = timed(lambda: compute_features(target.model, now.ids, aux, progress=False, known=rows))
    assert now.ids == before.ids, "the two ways continued differently"
    old_s, new_s = t_continue + t_forward, t_lengthen + t_rest
    print(f"{len(now.ids)} sequences, {info['continued_sequences']} continued (+{info['continued_tokens']} tokens), "
          f"{info['features_from_generation']} with features from generation")
    print(f"before: continuations {t_continue:.1f} s + feature forward {t_forward:.1f} s = {old_s:.1f} s")
    print(f"now:    continuations keeping states {t_lengthen:.1f} s + feature forward of the rest {t_rest:.1f} s "
          f"= {new_s:.1f} s")
    print(f"speed-up {old_s / new_s:.2f}x; max |aux diff| {(new.aux.float() - old.aux.float()).abs().max():.3g}, "
          f"max |hidden diff| {(new.hidden.float() - old.hidden.float()).abs().max():.3g}, "
          f"argmax agreement {(new.argmax == old.argmax).float().mean():.4f}")


if __name__ == "__main__":
    main()
