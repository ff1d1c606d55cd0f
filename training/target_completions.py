"""Target-generated traffic for bootstrapping and benchmarks: greedy completions as training data.

`target_traffic` runs batched greedy generation of the target on workload prompts (chat template
applied the way `serving.engine.Engine.encode` does), and can keep the target's top-k log-probs at every
generated position for free (they are a by-product of generation), which saves the distillation a
teacher forward pass per step. `save_traffic` writes them as `distill/` and `holdout/` datasets with
the columns `mining` uses (docs/architecture.md), plus the optional per-completion-token
`teacher_topk_values` / `teacher_topk_indices`.

Used where no served traffic exists yet (the v0 draft, benchmarks); the flywheel itself trains on mined
logs. It does not touch the Engine or the serving logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch


def encode_prompt(tokenizer: Any, prompt: str, chat: bool) -> tuple[str, list[int]]:
    """(text as fed to the model, token ids), the same encoding as the Engine's."""
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=False)
        return text, tokenizer(text, add_special_tokens=False)["input_ids"]
    return prompt, tokenizer(prompt)["input_ids"]


def _generate_batch(model: Any, prompt_ids: list[list[int]], pad_id: int, max_new_tokens: int,
                    logits: bool = True, hidden: bool = False) -> Any:
    width = max(len(p) for p in prompt_ids)
    # Left padding: every row's next token is then predicted at the same (last) position.
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompt_ids])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids])
    device = next(model.parameters()).device
    with torch.no_grad():
        return model.generate(input_ids=ids.to(device), attention_mask=mask.to(device), do_sample=False,
                              max_new_tokens=max_new_tokens, pad_token_id=pad_id, output_logits=logits,
                              output_hidden_states=hidden, return_dict_in_generate=True), width


def _pad_and_eos(model: Any, tokenizer: Any) -> tuple[int, set[int]]:
    """The pad id for left padding (the EOS when the tokenizer has none) and every id that ends a completion."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = model.generation_config.eos_token_id
    return pad_id, set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}


def _completion(tokens: list[int], eos_ids: set[int]) -> list[int]:
    """Generated tokens up to and including the first EOS (later ones are padding)."""
    for i, token in enumerate(tokens):
        if token in eos_ids:
            return tokens[: i + 1]
    return tokens


def target_traffic(model: Any, tokenizer: Any, workload: list[dict[str, str]], max_new_tokens: int,
                   batch_size: int = 8, top_k: int = 0, chat: bool = True, progress: bool = True) -> list[dict]:
    """Greedy target completions of `workload` rows ({"prompt", "slice"}) as distill-style rows."""
    from tqdm.auto import tqdm

    pad_id, eos_ids = _pad_and_eos(model, tokenizer)
    rows: list[dict] = []
    bar = tqdm(total=len(workload), desc="target traffic", disable=not progress)
    for start in range(0, len(workload), batch_size):
        batch = workload[start:start + batch_size]
        encoded = [encode_prompt(tokenizer, item["prompt"], chat) for item in batch]
        out, width = _generate_batch(model, [ids for _, ids in encoded], pad_id, max_new_tokens)
        if top_k:
            # logits[s]: [B, V] for generated position s -> top-k log-probs [B, S, k]
            logprobs = torch.log_softmax(torch.stack(out.logits, dim=1).float(), dim=-1).topk(top_k, dim=-1)
        for row, (item, (text, ids)) in enumerate(zip(batch, encoded)):
            completion = _completion(out.sequences[row, width:].tolist(), eos_ids)
            record = {"prompt": text, "completion": tokenizer.decode(completion), "prompt_token_ids": ids,
                      "completion_token_ids": completion, "slice": item.get("slice", "default"), "weight": 1.0}
            if top_k:
                record["teacher_topk_values"] = logprobs.values[row, :len(completion)].tolist()
                record["teacher_topk_indices"] = logprobs.indices[row, :len(completion)].tolist()
            rows.append(record)
        bar.update(len(batch))
    bar.close()
    return rows


def greedy_continuations(model: Any, tokenizer: Any, sequences: list[list[int]], max_new_tokens: int,
                         batch_size: int = 16, progress: bool = True,
                         on_states: Callable[[int, list[int], tuple[torch.Tensor, ...]], None] | None = None,
                         state_layers: list[int] | None = None) -> list[list[int]]:
    """The target's greedy continuation of each token sequence (up to and including an EOS), batched
    by length so little is padded. Used to lengthen logged completions that stopped at the request's
    max_new_tokens: more in-domain target output per logged prompt, at a batched forward's price.

    With `on_states`, generation also keeps the hidden states and calls `on_states(i, continuation,
    states)` for sequence i: for each of `state_layers` (indices into HF's hidden_states, embeddings = 0; default all),
    the [positions, H] states of every position the model was fed -- the sequence, then each generated
    token but the last (past an EOS: padding, not data)."""
    from tqdm.auto import tqdm

    pad_id, eos_ids = _pad_and_eos(model, tokenizer)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    result: list[list[int]] = [[] for _ in sequences]
    bar = tqdm(total=len(sequences), desc="target continuations", disable=not progress)
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        out, width = _generate_batch(model, [sequences[i] for i in batch], pad_id, max_new_tokens, logits=False,
                                     hidden=on_states is not None)
        for row, i in enumerate(batch):
            result[i] = _completion(out.sequences[row, width:].tolist(), eos_ids)
            if on_states is not None:
                layers = state_layers if state_layers is not None else range(len(out.hidden_states[0]))
                on_states(i, result[i], _fed_states(out.hidden_states, row, width - len(sequences[i]), layers))
        bar.update(len(batch))
    bar.close()
    return result


def _fed_states(steps: tuple, row: int, pad: int, layers: Any) -> tuple[torch.Tensor, ...]:
    """One row of generate's hidden states ([step][layer] -> [B, positions, H]: the prefill's, then one
    position per decoding step) as [positions, H] per layer in `layers`, without the row's left padding."""
    return tuple(torch.cat([steps[0][layer][row, pad:]] + [step[layer][row] for step in steps[1:]])
                 for layer in layers)


def holdout_rows(rows: list[dict]) -> list[dict]:
    """Distill-style rows as `holdout/` rows (what shadow replay and evaluation read)."""
    return [{"request_id": f"traffic-{i}", "prompt": r["prompt"], "prompt_token_ids": r["prompt_token_ids"],
             "slice": r["slice"], "max_new_tokens": max(1, len(r["completion_token_ids"])),
             "output_token_ids": r["completion_token_ids"]} for i, r in enumerate(rows)]


def save_rows(rows: list[dict], path: str | Path) -> Path:
    """Write rows (one dict each, same keys) as a `datasets` dataset dir."""
    from datasets import Dataset

    if not rows:
        raise ValueError(f"no rows to save at {path}")
    columns = {key: [r[key] for r in rows] for key in rows[0]}
    Dataset.from_dict(columns).save_to_disk(str(path))
    return Path(path)


def save_traffic(train: list[dict], holdout: list[dict], out_dir: str | Path) -> dict[str, Path]:
    """`out_dir/distill` from `train` and `out_dir/holdout` from `holdout` rows."""
    out_dir = Path(out_dir)
    paths = {"distill": save_rows(train, out_dir / "distill")}
    if holdout:
        paths["holdout"] = save_rows(holdout_rows(holdout), out_dir / "holdout")
    return paths
