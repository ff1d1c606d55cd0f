"""Target-generated traffic for bootstrapping and benchmarks: greedy completions as training data.

`target_traffic` runs batched greedy generation of the target on workload prompts (chat template
applied the way `draftwheel.serving.engine.engine.Engine.encode` does), and can keep the target's top-k log-probs at every
generated position for free (they are a by-product of generation), which saves the distillation a
teacher forward pass per step. `save_traffic` writes them as `distill/` and `holdout/` datasets with
the columns `mining` uses (docs/architecture.md), plus the optional per-completion-token
`teacher_topk_values` / `teacher_topk_indices`.

Used where no served traffic exists yet (the v0 draft, benchmarks); the flywheel itself trains on mined
logs. It does not touch the Engine or the serving logs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import torch
from transformers import DynamicCache

from draftwheel.serving.engine.sampling import greedy


def encode_prompt(tokenizer: Any, prompt: str, chat: bool) -> tuple[str, list[int]]:
    """(text as fed to the model, token ids), the same encoding as the Engine's."""
    if chat:
        text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                             tokenize=False)
        return text, tokenizer(text, add_special_tokens=False)["input_ids"]
    return prompt, tokenizer(prompt)["input_ids"]


def _decode_batch(model: Any, prompt_ids: list[list[int]], pad_id: int, eos_ids: set[int], limits: list[int],
                  logits: bool = False, layers: Sequence[int] | None = None, temperature: float = 0.0,
                  generator: torch.Generator | None = None) -> list[dict[str, Any]]:
    """Greedy decoding (or, with `temperature` > 0, sampling from softmax(logits / temperature) with
    `generator`) of a left-padded batch in which a row leaves the batch (and the KV cache,
    `Cache.batch_select_indices`) as soon as it ends: an EOS, or `limits[i]` new tokens. HF's generate
    decodes every row until the last one ends; on a shifted-code round's continuations that was ~40 % of
    the row-steps, and a decoding step costs about the same per row at any batch size.

    Per row: "tokens" (up to and including an EOS); with `logits`, "logits" [S, V], the raw logits
    each token was picked from; with `layers` (indices into HF's hidden_states, embeddings = 0),
    "states": per layer the [positions, H] states of every position the model was fed -- the prompt
    without its padding, then each new token but one that ended at the limit (an EOS is fed, so that
    the answer's last position has states too)."""
    if min(limits) < 1:
        raise ValueError(f"limits: every row needs at least 1 new token, got {min(limits)}")
    device = next(model.parameters()).device
    width = max(len(p) for p in prompt_ids)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompt_ids], device=device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompt_ids], device=device)
    cache = DynamicCache(config=model.config)
    rows: list[dict[str, Any]] = [{"tokens": [], "logits": [], "states": []} for _ in prompt_ids]
    alive = list(range(len(prompt_ids)))  # batch row j decodes prompt_ids[alive[j]]

    def forward(input_ids: torch.Tensor, position: torch.Tensor, prefill: bool = False) -> torch.Tensor:
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=position, cache=cache, use_cache=True,
                    logits_to_keep=1, output_hidden_states=layers is not None)
        if layers is not None:
            for j, i in enumerate(alive):
                pad = width - len(prompt_ids[i]) if prefill else 0
                rows[i]["states"].append([out.hidden_states[layer][j, pad:] for layer in layers])
        return out.logits[:, -1]

    with torch.no_grad():
        position = (mask.cumsum(-1) - 1).clamp(min=0)
        step = forward(ids, position, prefill=True)
        position = position[:, -1:]
        while True:
            if temperature > 0:
                probs = torch.softmax(step.float() / temperature, -1)
                chosen = torch.multinomial(probs, 1, generator=generator).view(-1)
            else:
                chosen = greedy(step)
            going = []
            for j, (i, token) in enumerate(zip(alive, chosen.tolist())):
                tokens = rows[i]["tokens"]
                if tokens and tokens[-1] in eos_ids:
                    continue  # its EOS was fed in this step, for its states: done
                tokens.append(token)
                if logits:
                    rows[i]["logits"].append(step[j])
                if len(tokens) < limits[i] and (token not in eos_ids or layers is not None):
                    going.append(j)
            if not going:
                break
            if len(going) < len(alive):
                keep = torch.tensor(going, device=device)
                cache.batch_select_indices(keep)
                mask, chosen, position = mask[keep], chosen[keep], position[keep]
                alive = [alive[j] for j in going]
            mask = torch.cat([mask, mask.new_ones(len(alive), 1)], -1)
            position = position + 1
            step = forward(chosen[:, None], position)
    for row in rows:
        row["logits"] = torch.stack(row["logits"]) if logits else None
        row["states"] = tuple(torch.cat(parts) for parts in zip(*row["states"])) if layers is not None else None
    return rows


def _pad_and_eos(model: Any, tokenizer: Any) -> tuple[int, set[int]]:
    """The pad id for left padding (the EOS when the tokenizer has none) and every id that ends a completion."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    eos = model.generation_config.eos_token_id
    return pad_id, set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}


def _kept_layers(model: Any, on_states: Any, state_layers: list[int] | None) -> Sequence[int] | None:
    """The hidden-state layers generation keeps for `on_states` (indices into HF's hidden_states,
    embeddings = 0; default all), or None when nothing is kept."""
    if on_states is None:
        return None
    return state_layers if state_layers is not None else range(model.config.num_hidden_layers + 1)


def target_traffic(model: Any, tokenizer: Any, workload: list[dict[str, str]], max_new_tokens: int,
                   batch_size: int = 8, top_k: int = 0, chat: bool = True, progress: bool = True,
                   temperature: float = 0.0, seed: int = 0,
                   on_states: Callable[[list[int], list[int], tuple[torch.Tensor, ...]], None] | None = None,
                   state_layers: list[int] | None = None) -> list[dict]:
    """Target completions of `workload` rows ({"prompt", "slice"}) as distill-style rows: greedy, or
    sampled at `temperature` (seeded by `seed`: the same rows every run).

    With `on_states`, generation also keeps the hidden states of `state_layers` (as `greedy_continuations`)
    and calls `on_states(prompt ids, generated tokens, states)` per row: it generates one token past
    `max_new_tokens` (dropped from the row) so that the last kept token is fed too and has states."""
    from tqdm.auto import tqdm

    pad_id, eos_ids = _pad_and_eos(model, tokenizer)
    generator = torch.Generator().manual_seed(seed) if temperature > 0 else None
    layers = _kept_layers(model, on_states, state_layers)
    limit = max_new_tokens + (on_states is not None)
    rows: list[dict] = []
    bar = tqdm(total=len(workload), desc="target traffic", disable=not progress)
    for start in range(0, len(workload), batch_size):
        batch = workload[start:start + batch_size]
        encoded = [encode_prompt(tokenizer, item["prompt"], chat) for item in batch]
        decoded = _decode_batch(model, [ids for _, ids in encoded], pad_id, eos_ids, [limit] * len(batch),
                                logits=bool(top_k), temperature=temperature, generator=generator, layers=layers)
        for out, item, (text, ids) in zip(decoded, batch, encoded):
            completion = out["tokens"][:max_new_tokens]
            if on_states is not None:
                on_states(ids, out["tokens"], out["states"])
            record = {"prompt": text, "completion": tokenizer.decode(completion), "prompt_token_ids": ids,
                      "completion_token_ids": completion, "slice": item.get("slice", "default"), "weight": 1.0}
            if top_k:  # [S, V] logits -> top-k log-probs [S, k]
                best = torch.log_softmax(out["logits"][:len(completion)].float(), dim=-1).topk(top_k, dim=-1)
                record["teacher_topk_values"], record["teacher_topk_indices"] = best.values.tolist(), best.indices.tolist()
            rows.append(record)
        bar.update(len(batch))
    bar.close()
    return rows


def greedy_continuations(model: Any, tokenizer: Any, sequences: list[list[int]], max_new_tokens: int | list[int],
                         batch_size: int = 16, progress: bool = True,
                         on_states: Callable[[int, list[int], tuple[torch.Tensor, ...]], None] | None = None,
                         state_layers: list[int] | None = None) -> list[list[int]]:
    """The target's greedy continuation of each token sequence (up to and including an EOS, at most
    `max_new_tokens` tokens: one limit, or one per sequence), batched by length so little is padded.
    Used to lengthen logged completions that stopped at the request's max_new_tokens: more in-domain
    target output per logged prompt, at a batched forward's price.

    With `on_states`, generation also keeps the hidden states and calls `on_states(i, continuation,
    states)` for sequence i: for each of `state_layers` (indices into HF's hidden_states, embeddings = 0;
    default all), the [positions, H] states of every position the model was fed -- the sequence, then
    each generated token but one that ended at the limit (`_decode_batch`)."""
    from tqdm.auto import tqdm

    pad_id, eos_ids = _pad_and_eos(model, tokenizer)
    limits = [max_new_tokens] * len(sequences) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    layers = _kept_layers(model, on_states, state_layers)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    result: list[list[int]] = [[] for _ in sequences]
    bar = tqdm(total=len(sequences), desc="target continuations", disable=not progress)
    for start in range(0, len(order), batch_size):
        batch = order[start:start + batch_size]
        decoded = _decode_batch(model, [sequences[i] for i in batch], pad_id, eos_ids, [limits[i] for i in batch],
                                layers=layers)
        for i, out in zip(batch, decoded):
            result[i] = out["tokens"]
            if on_states is not None:
                on_states(i, result[i], out["states"])
        bar.update(len(batch))
    bar.close()
    return result


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
