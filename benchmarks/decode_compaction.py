"""Target continuations of an eagle round's cut outputs, two ways, on the same mined dataset in one run:
HF `generate` (every row of a batch decodes until the last one ends: how `lengthen` generated before)
vs `training.target_completions.greedy_continuations` (a row leaves the batch once it ends, at an EOS or
at its own limit), on the stock target and on the prepacked copy `lengthen` generates with
(`eagle_train.generation_model`). All keep the hidden states `lengthen` keeps. Prints the times, their
ratios, the decoded row-steps and how many continuations agree token for token.

    flock /tmp/draftwheel-heavy.lock .venv/bin/python benchmarks/decode_compaction.py \\
        --dataset <flywheel run>/datasets/distill
"""

from __future__ import annotations

import argparse
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
from training.target_completions import _pad_and_eos, greedy_continuations


def hf_generate(model, sequences: list[list[int]], pad_id: int, eos: set[int], max_new_tokens: int,
                batch_size: int) -> tuple[list[list[int]], int]:
    """The earlier way: HF generate on length-sorted batches, hidden states kept. (continuations, row-steps)."""
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    result, row_steps = [[] for _ in sequences], 0
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        width = max(len(sequences[i]) for i in batch)
        ids = torch.tensor([[pad_id] * (width - len(sequences[i])) + sequences[i] for i in batch])
        mask = torch.tensor([[0] * (width - len(sequences[i])) + [1] * len(sequences[i]) for i in batch])
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new_tokens,
                                 pad_token_id=pad_id, output_hidden_states=True, return_dict_in_generate=True)
        row_steps += len(batch) * (out.sequences.shape[1] - width)
        for row, i in enumerate(batch):
            tokens = out.sequences[row, width:].tolist()
            end = next((j + 1 for j, t in enumerate(tokens) if t in eos), len(tokens))
            result[i] = tokens[:end]
    return result, row_steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dataset", required=True, help="a mined distill/ dataset dir")
    parser.add_argument("--target", default=None, help="target model dir (default: the reference target)")
    parser.add_argument("--batch-size", type=int, default=32, help="rows per batch (lengthen's: 32)")
    parser.add_argument("--skip-hf", action="store_true", help="compare only the stock and prepacked targets")
    args = parser.parse_args()
    apply_offline_defaults()
    config = load_config(eagle_train.EagleConfig, str(Path(__file__).parents[1] / "configs/eagle.yaml"), [])
    target = load_model(args.target or str(default_target_dir()))
    eos = eos_token_ids(target)
    seqs = eagle_train.load_sequences(Path(args.dataset), config.max_length)
    todo = eagle_train.continuation_room(seqs, eos, config)  # lengthen's selection and limits
    sequences, room = [seqs.ids[i] for i in todo], list(todo.values())
    pad_id, _ = _pad_and_eos(target.model, target.tokenizer)
    layers = [*default_aux_layer_ids(target.model.config.num_hidden_layers), -1]

    def ours(model) -> tuple[list[list[int]], float]:
        start = time.perf_counter()
        out = greedy_continuations(model, target.tokenizer, sequences, [r + 1 for r in room], args.batch_size,
                                   progress=False, on_states=lambda i, more, states: None, state_layers=layers)
        return out, time.perf_counter() - start

    def agree(a: list[list[int]], b: list[list[int]]) -> int:
        return sum(x[:r] == y[:r] for x, y, r in zip(a, b, room))

    print(f"{len(sequences)} cut outputs continued, up to {max(room)} tokens each, batches of {args.batch_size}")
    now, t_now = ours(target.model)
    now_steps = sum(len(c) for c in now)  # one row-step per new token (and one more to feed an EOS)
    if not args.skip_hf:
        start = time.perf_counter()
        before, before_steps = hf_generate(target.model, sequences, pad_id, eos, max(room) + 1, args.batch_size)
        t_before = time.perf_counter() - start
        print(f"HF generate (every row until the batch's last ends): {t_before:.1f} s, {before_steps} row-steps")
    print(f"greedy_continuations (a row leaves once it ends):    {t_now:.1f} s, ~{now_steps} row-steps")
    if not args.skip_hf:
        print(f"speed-up {t_before / t_now:.2f}x; kept tokens identical for {agree(before, now)}/{len(sequences)}")
    packed, t_packed = ours(eagle_train.generation_model(target, bf16=False))
    print(f"the same on lengthen's prepacked copy (oneDNN):     {t_packed:.1f} s")
    print(f"prepacked vs stock {t_now / t_packed:.2f}x; kept tokens identical for {agree(now, packed)}/{len(sequences)}")


if __name__ == "__main__":
    main()
