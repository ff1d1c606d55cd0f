"""The serving flags users reach for first, defined once so they mean the same on every command:
`--k`, `--min-path-prob`, `--dtype` (generate, bench, serve, traffic, demo, shadow), `--device` (generate,
bench, serve, traffic) and `--served-model-name` (serve); and what `--target` defaults to, said once.

Each maps onto the `ServeConfig` field of the same name. A command that reads a config (serve, bench)
passes `default=None`, so an unset flag leaves the config's value; the others pass their own default.
Only argparse here: no torch, so `draftwheel --help` stays fast. Not here: applying the values.
"""

from __future__ import annotations

import argparse
from typing import Any

from draftwheel.serving.engine.precision import CHOICES as PRECISIONS, DEVICES

TARGET_DEFAULT_HELP = ("target model: dir, hub id or models:/NAME@ALIAS (default: the target the champion was "
                       "trained for, as the registry recorded it; with no champion, the reference target)")


def _default(default: Any, config_default: Any) -> str:
    return f"default {default}" if default is not None else f"default: the config's, {config_default}"


def add_k(parser: argparse.ArgumentParser, default: int | None) -> None:
    parser.add_argument("--k", type=int, default=default,
                        help=f"draft tokens per verification step, at most ({_default(default, 4)})")


def add_min_path_prob(parser: argparse.ArgumentParser, default: float | None) -> None:
    parser.add_argument("--min-path-prob", dest="min_path_prob", type=float, default=default, metavar="P",
                        help="eagle3: stop drafting once the draft's own probability of the chain falls below "
                             f"this; 0 = always k tokens ({_default(default, 0.25)})")


def add_dtype(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument("--dtype", choices=PRECISIONS, default=default,
                        help="serving precision: auto is bfloat16 on CPUs with AMX-BF16 or AVX-512 BF16 (on AMX verifying k+1 "
                             f"tokens costs about one decoding step), else float32 ({_default(default, 'auto')})")


def add_device(parser: argparse.ArgumentParser, default: str | None) -> None:
    parser.add_argument("--device", default=default, metavar="{" + ",".join(DEVICES) + ",cuda:N}",
                        help=f"where the models run: auto is CUDA when present, else the CPU ({_default(default, 'auto')})")


def add_served_model_name(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--served-model-name", dest="served_model_name", metavar="NAME",
                        help="the `model` name clients send and responses carry (default: the target's name)")
