"""`draftwheel train eagle`: train an EAGLE-3 draft (draftwheel.serving.engine.eagle) on the target's own outputs.

Data: the mined `distill/` dataset (prompt + the target's output token ids). Features: one batched,
teacher-forced target forward per group of sequences, cached on disk (draftwheel.training.eagle_features).
Loss: forward KL from the target's distribution restricted to the draft vocabulary, with the draft
unrolled on its own outputs for `ttt_steps` steps, step s weighted `ttt_decay**s` (draftwheel.training.eagle_ttt).
Vocabulary: the `draft_vocab_size` most frequent output tokens (FR-Spec); a warm-started draft keeps
its champion's vocabulary while that still covers `min_vocab_coverage` of the data's output tokens.
Continuation (`continue_to`): logged outputs that a request's max_new_tokens cut short are continued
with the target's own greedy tokens (batched generation, cached), several times the in-domain data of
the logged requests at a fraction of serving them.
Prompt variants (`prompt_variants`): each multi-line mined prompt cut 1..N lines short is another request
of its slice; the same generation answers it with the target's greedy tokens (draftwheel.training.prompt_variants).
Rehearsal (against forgetting): a warm-started draft also trains on a fixed, seeded sample of the data
its warm start learned from (`rehearsal: auto` follows its training info back to the bootstrap data,
whose features are already cached), `rehearsal_ratio` sequences per mined one, so a round on one new
slice does not overwrite what the champion does well elsewhere. `mined_passes` repeats the mined
sequences within each epoch (the rehearsal sample is seen once), up to `max_mined_per_epoch` in all; a
capped epoch shrinks the rehearsal sample in proportion (`rehearsal_count`).
Epoch selection (against forgetting too): before training and after each epoch, the implied mean
accepted length at k = `eval_k` is measured per slice on a probe -- the round's hold-out, the warm
start's own hold-out and the canary prompts -- and the saved weights are those of the epoch best for
the shadow gate: no slice down more than `forgetting_tolerance`, then the largest gain (the rule the
lm trainer uses, draftwheel.training.evaluate.EpochSelection). A warm-started round then also judges
points between its start and those weights (`weight_mixes`): where the weights lost a slice group on the
probe, it keeps a mix that holds most of the gain instead (draftwheel.training.evaluate.best_mix,
docs/training.md "Weight mixes"). A `transformers.Trainer`, so `accelerate launch -m
draftwheel.training.eagle_train --config F` works as for the other trainers.

It does not mine, register or promote.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import Trainer, TrainingArguments
from transformers.trainer_pt_utils import LengthGroupedSampler

from draftwheel import home
from draftwheel.config import to_dict
from draftwheel.registry_names import CHAMPION_URI
from draftwheel.serving.engine.eagle import Eagle3Config, Eagle3Draft, default_aux_layer_ids, save_eagle3, vocab_from_counts
from draftwheel.serving.engine.precision import resolve_bf16, resolve_target_bf16
from draftwheel.serving.engine.prepack import can_prepack, prepack_linears
from draftwheel.serving.engine.reference import hub_id
from draftwheel.training import cache_budget, common
from draftwheel.training.confidence import describe, fit_temperature
from draftwheel.training.data import join_and_truncate, load_dataset_dir
from draftwheel.training.eagle_features import Features, cached_features, compute_features, join_features, row_from_states
from draftwheel.training.eagle_ttt import chain_acceptance, implied_mal, served_walk, unroll, unrolled_loss
from draftwheel.training.evaluate import EpochSelectionCallback, TrackerCallback, slice_key
from draftwheel.training.prompt_variants import variant_prompts

METRIC = "implied_mal"  # the per-epoch probe's teacher-forced figure: every answer position's chain averaged
SERVED = "served_mal"  # beside it, serving's walk over the same chains: what the gate measures

COLUMNS = ("prompt_token_ids", "completion_token_ids")


@dataclass
class EagleConfig(common.TrainCommon, common.EpochSelectionFields):
    """EAGLE-3 draft training; see configs/eagle.yaml for the defaults with comments."""

    student: str = CHAMPION_URI  # starting draft: an eagle3 dir/URI warm-starts; other kinds start fresh
    target: str = ""             # target model dir / models:/ URI; "" = the reference target in the state dir
    dataset: str = ""            # distill/ dataset dir; "" = <state>/datasets/distill
    holdout: str = ""            # holdout/ dataset dir; "" = sibling of dataset, if any
    draft_vocab_size: int = 4096  # rows of the draft head (FR-Spec: most frequent output tokens)
    min_vocab_coverage: float = 0.97  # rebuild the warm start's vocabulary below this output-token coverage
    aux_layer_ids: list[int] = field(default_factory=list)  # target layers fused; [] = EAGLE-3's (2, L/2, L-3)
    ttt_steps: int = 4           # training-time-test unroll depth
    ttt_decay: float = 0.8       # weight of unroll step s is ttt_decay**s
    ttt_chain_share: float = 1.0  # share of slots (a fresh random sample each batch) unrolled past step 0
    teacher_temperature: float = 1.0  # the target's distribution is learned at this temperature (< 1: sharpened)
    acceptance_weight: float = 0.0  # add this times the rejection chance 1 - sum min(p, q) to each step's KL (0 = KL alone)
    prompt_loss: bool = True     # also learn positions inside the prompt (more signal; serving sees prompts too)
    residual_floor: float = 1.0  # weight of a mined answer token the served stack drafted and had accepted (draftwheel.mining.residual);
                                 # what it missed weighs 1. 1.0 = every position alike (uniform)
    feature_cache: str = ""      # "" = <state>/cache/eagle-features
    cache_max_gb: float = 4.0    # the feature cache's budget, least recently used deleted first (draftwheel.training.cache_budget; 0 = none)
    continue_to: int = 0         # lengthen outputs cut at their length limit with the target's greedy continuation to this many tokens (0 = off)
    prompt_variants: int = 0     # also train on each multi-line mined prompt cut 1..N lines short, answered by the target (needs continue_to)
    prompt_renames: int = 0      # ...and on each renamed this many times (its names swapped for other requests' names)
    rehearsal: str = "auto"      # earlier data mixed in: a dataset dir | auto = the warm start's own (training info) | "" = none
    rehearsal_ratio: float = 1.0  # rehearsal sequences per mined sequence (a fixed seeded sample)
    mined_passes: int = 1        # times each mined sequence is seen per epoch (rehearsal and probe stay once)
    max_mined_per_epoch: int = 0  # at most this many mined sequences per epoch, passes included (0 = no cap): more traffic, same time
    probe_canary: bool = True    # forgetting probe: also evaluate each epoch on the canary prompts (target's greedy answers)
    select_on: str = METRIC      # the probe figure epoch selection compares: implied_mal | served_mal (what the gate measures)
    eval_min_path_prob: float = 0.25  # serving's chain cut, walked by the probe's served_mal (configs/serve.yaml's min_path_prob)
    calibrate_confidence: bool = True  # fit the draft's confidence temperature on the probe at the end (draftwheel.training.confidence)
    identity_init: bool = True   # a fresh draft starts as the target's top aux feature through its norm and head
    bf16: bool | str = "auto"    # bfloat16 autocast for training the draft; auto = where it is fast (draftwheel.serving.engine.precision.resolve_bf16)
    target_bf16: bool | str = "auto"  # the target's side (continuations, features) in bfloat16; auto = with bf16, where the target serves in bfloat16 (precision.resolve_target_bf16)
    learning_rate: float = 2e-3
    epochs: float = 4.0
    batch_size: int = 8
    max_length: int = 384
    warmup_steps: int = 10

    def __post_init__(self) -> None:
        super().__post_init__()
        # resolved once: cache keys and run params record what ran
        self.bf16 = resolve_bf16(self.bf16, self.device)
        self.target_bf16 = resolve_target_bf16(self.target_bf16, self.bf16, self.device)
        common.require(self.draft_vocab_size >= 2, "draft_vocab_size", f"must be >= 2, got {self.draft_vocab_size}")
        common.require(0.0 < self.min_vocab_coverage <= 1.0, "min_vocab_coverage",
                       f"must be in (0, 1], got {self.min_vocab_coverage}")
        common.require(self.ttt_steps >= 1, "ttt_steps", f"must be >= 1, got {self.ttt_steps}")
        common.require(0.0 < self.ttt_decay <= 1.0, "ttt_decay", f"must be in (0, 1], got {self.ttt_decay}")
        common.require(0.0 < self.ttt_chain_share <= 1.0, "ttt_chain_share",
                       f"must be in (0, 1], got {self.ttt_chain_share}")
        common.require(self.teacher_temperature > 0.0, "teacher_temperature",
                       f"must be > 0, got {self.teacher_temperature}")
        common.require(0.0 <= self.eval_min_path_prob < 1.0, "eval_min_path_prob",
                       f"must be in [0, 1), got {self.eval_min_path_prob}")
        common.require(self.acceptance_weight >= 0.0, "acceptance_weight",
                       f"must be >= 0, got {self.acceptance_weight}")
        common.require(self.cache_max_gb >= 0.0, "cache_max_gb", f"must be >= 0, got {self.cache_max_gb}")
        common.require(self.continue_to >= 0, "continue_to", f"must be >= 0, got {self.continue_to}")
        common.require(0.0 <= self.residual_floor <= 1.0, "residual_floor",
                       f"must be in [0, 1], got {self.residual_floor}")
        for name in ("prompt_variants", "prompt_renames"):
            value = getattr(self, name)
            common.require(value >= 0, name, f"must be >= 0, got {value}")
            common.require(not value or self.continue_to > 0, name,
                           "needs continue_to > 0: the continuation step generates the variants' answers")
        common.require(self.rehearsal_ratio >= 0.0, "rehearsal_ratio", f"must be >= 0, got {self.rehearsal_ratio}")
        common.require(self.mined_passes >= 1, "mined_passes", f"must be >= 1, got {self.mined_passes}")
        common.require(self.max_mined_per_epoch >= 0, "max_mined_per_epoch",
                       f"must be >= 0 (0 = no cap), got {self.max_mined_per_epoch}")
        self.check_selection()
        common.require(self.select_on in (SERVED, METRIC), "select_on",
                       f"must be {SERVED!r} or {METRIC!r}, got {self.select_on!r}")
        common.require(len(self.aux_layer_ids) in (0, 3), "aux_layer_ids",
                       f"must list 3 layer ids or be empty, got {self.aux_layer_ids}")


@dataclass
class Sequences:
    ids: list[list[int]]
    prompt_lens: list[int]
    slices: list[str]
    weights: dict[int, list[float]] = field(default_factory=dict)
    """Per sequence index, the loss weight of each position's next-token prediction (position t predicts
    ids[t + 1]); sequences not in it, and positions past the list (a continuation), weigh 1."""

    def add(self, prompt_ids: list[int], output_ids: list[int], slice_name: str, max_length: int,
            output_weights: list[float] | None = None) -> None:
        """prompt + output, truncated as the other trainers do; rows without an output token to learn
        are skipped. `output_weights`: one per output token (the prompt's tokens weigh 1)."""
        ids, prompt_len = join_and_truncate(prompt_ids, output_ids, max_length)
        if len(ids) > prompt_len and len(ids) >= 3:
            if output_weights is not None:
                # position t predicts token t + 1: an output token's weight goes to the position before it
                self.weights[len(self.ids)] = ([1.0] * (prompt_len - 1) + list(output_weights) + [1.0])[:len(ids)]
            self.ids.append(ids)
            self.prompt_lens.append(prompt_len)
            self.slices.append(slice_name)

    def extend(self, other: "Sequences") -> None:
        self.weights.update({len(self.ids) + i: w for i, w in other.weights.items()})
        self.ids += other.ids
        self.prompt_lens += other.prompt_lens
        self.slices += other.slices

    def position_weights(self, i: int) -> torch.Tensor:
        """[len(ids[i])] loss weights of sequence i's positions."""
        weights = torch.ones(len(self.ids[i]))
        own = self.weights.get(i)
        if own:
            weights[: len(own)] = torch.tensor(own[: len(self.ids[i])])
        return weights


def load_sequences(path: Path, max_length: int, output_column: str = "completion_token_ids",
                   max_samples: int = 0, residual_floor: float = 1.0) -> Sequences:
    """prompt + output ids per row (truncated as the other trainers do), at most `max_samples` rows (0 = all).
    With `residual_floor` < 1 and a mined `served_residual` column, each output token weighs
    max(residual, floor): what the served stack missed weighs 1, what it drafted and had accepted the floor."""
    dataset = load_dataset_dir(path, ("prompt_token_ids", output_column))
    if max_samples:
        dataset = dataset.select(range(min(max_samples, len(dataset))))
    weighted = residual_floor < 1.0 and "served_residual" in dataset.column_names
    seqs = Sequences([], [], [])
    for row in dataset:
        weights = [max(r, residual_floor) for r in row["served_residual"]] if weighted else None
        seqs.add(row["prompt_token_ids"], row[output_column], row.get("slice", "default"), max_length, weights)
    return seqs


def output_counts(seqs: Sequences, vocab_size: int) -> torch.Tensor:
    """How often each target id appears in the outputs (what the draft must be able to propose)."""
    outputs = [t for ids, p in zip(seqs.ids, seqs.prompt_lens) for t in ids[p:]]
    return torch.bincount(torch.tensor(outputs, dtype=torch.long), minlength=vocab_size)[:vocab_size]


def coverage(t2d: torch.Tensor, counts: torch.Tensor) -> float:
    """Share of output tokens the draft vocabulary contains."""
    return float(counts[t2d].sum() / counts.sum().clamp_min(1))


def fresh_draft(target: Any, config: EagleConfig, counts: torch.Tensor, target_sha: str, eos: list[int]) -> Eagle3Draft:
    """A new draft whose head and final norm start as the target's own (restricted to the draft vocabulary)."""
    d2t, t2d = vocab_from_counts(counts, config.draft_vocab_size, always=eos)
    c = Eagle3Config.for_target(target.config, draft_vocab_size=d2t.shape[0], aux_layer_ids=config.aux_layer_ids or None,
                                speculative_tokens=config.eval_k, target_sha256=target_sha)
    torch.manual_seed(config.seed)
    draft = Eagle3Draft(c, d2t=d2t, t2d=t2d)
    with torch.no_grad():
        draft.lm_head.weight.copy_(target.get_output_embeddings().weight[draft.draft_to_target])
        draft.norm.weight.copy_(target.model.norm.weight)
        if config.identity_init:
            # Start as "the target's highest aux feature, through the target's own norm and head": fc passes
            # that feature through, and the layer's residual branches start at zero (as Medusa's blocks do).
            hidden = c.hidden_size
            draft.fc.weight.zero_()
            draft.fc.weight[:, 2 * c.target_hidden_size:].copy_(torch.eye(hidden, c.target_hidden_size))
            draft.layers[0].self_attn.o_proj.weight.zero_()
            draft.layers[0].mlp.down_proj.weight.zero_()
    return draft


def revocab(draft: Eagle3Draft, counts: torch.Tensor, size: int, target: Any, eos: list[int]) -> Eagle3Draft:
    """The same draft over a new vocabulary: rows of kept tokens carry over, new rows start from the target's head.

    Tokens rank by `counts` (train_eagle's: the new data's outputs plus those of the data the warm start
    learned from); the old vocabulary's other tokens fill the rest (a half count each), not arbitrary
    unseen ids. A round's data is small (the demo's: ~1.5k distinct output
    tokens for 4096 slots), so a vocabulary from it alone covered 81 % of the same slice's hold-out and
    dropped the tokens the draft proposed on every other slice."""
    d2t, t2d = vocab_from_counts(counts.double() + 0.5 * draft.t2d.double(), size, always=eos)
    new = Eagle3Draft(dataclasses.replace(draft.c, draft_vocab_size=d2t.shape[0]), d2t=d2t, t2d=t2d)
    state = {k: v for k, v in draft.state_dict().items() if not k.startswith("lm_head") and k not in ("d2t", "t2d")}
    new.load_state_dict(state, strict=False)
    old_rows = {int(t): i for i, t in enumerate(draft.draft_to_target)}
    with torch.no_grad():
        head = target.get_output_embeddings().weight
        for i, token in enumerate(new.draft_to_target.tolist()):
            row = old_rows.get(token)
            new.lm_head.weight[i] = draft.lm_head.weight[row] if row is not None else head[token]
    return new


def generation_model(target: Any, bf16: bool) -> Any:
    """The target for batched generation: a copy with its linear layers prepacked for oneDNN, as serving
    runs it (draftwheel.serving.engine.prepack: MKL re-packs every weight on each of decoding's small calls; a shifted-code round's
    round continuations took 74.1 s instead of 97.1 s, the same tokens for 82/82), in bfloat16 with `bf16`
    (~1.9x faster on AMX CPUs, and the precision serving runs with dtype: auto). With neither to do (a
    GPU target in float32) it is the model itself: no second copy in memory."""
    if not (bf16 or can_prepack(target.model)):
        return target.model
    model = copy.deepcopy(target.model)
    model = model.to(torch.bfloat16) if bf16 else model
    prepack_linears(model)
    return model


def _json_path(folder: Path, key: Any) -> Path:
    """Where a JSON result keyed by `key` is stored under `folder`: the digest of the key."""
    return folder / f"{hashlib.sha256(json.dumps(key).encode()).hexdigest()[:24]}.json"


def _store_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value))
    tmp.replace(path)  # a crash mid-write never leaves a truncated entry behind


def cached_generation(folder: Path, key: Any, generate: Any) -> tuple[Any, bool]:
    """`generate()`'s JSON result, stored under `folder` by the digest of `key` and reused: (result, hit)."""
    path = _json_path(folder, key)
    if path.is_file():
        cache_budget.touch(path)
        return json.loads(path.read_text()), True
    result = generate()
    _store_json(path, result)
    return result, False


def cached_continuations(folder: Path, key: Any, sequences: list[list[int]], limits: list[int],
                         generate: Any) -> tuple[list[list[int]], list[int]]:
    """Each sequence's continuation, read from `folder` where stored (one file per sequence, by the digest of
    its tokens, its limit and `key`), the rest made by one `generate(missing)` call (the indices of those
    not stored, in order: it returns their continuations) and stored. Per sequence, so a round whose
    retained corpus holds earlier rounds' rows generates only its new ones (keyed by the whole set, a
    four-round stream's last round continued all 106 of its sequences again: 70 s of its training step).
    Returns (continuations, the indices generated)."""
    paths = [_json_path(folder, [ids, limit, key]) for ids, limit in zip(sequences, limits)]
    result = [json.loads(path.read_text()) if path.is_file() else None for path in paths]
    missing = [i for i, known in enumerate(result) if known is None]
    for path, known in zip(paths, result):
        if known is not None:
            cache_budget.touch(path)
    if missing:
        for i, more in zip(missing, generate(missing)):
            result[i] = more
            _store_json(paths[i], more)
    return result, missing


def continuation_room(seqs: Sequences, eos: set[int], config: EagleConfig) -> dict[int, int]:
    """{sequence index: tokens to add} for every output cut short of `continue_to` output tokens without
    an EOS: up to `continue_to` output tokens, and `max_length` in all."""
    return {i: min(config.continue_to - (len(ids) - p), config.max_length - len(ids))
            for i, (ids, p) in enumerate(zip(seqs.ids, seqs.prompt_lens))
            if ids[-1] not in eos and len(ids) - p < config.continue_to and len(ids) < config.max_length}


def lengthen(seqs: Sequences, target: Any, eos: set[int], config: EagleConfig, cache_root: Path,
             aux_layer_ids: list[int] | None) -> tuple[dict[str, Any], dict[int, tuple]]:
    """Continue (in place) every output that stopped short of `continue_to` tokens without an EOS -- a
    logged request's max_new_tokens, not the answer, ended it -- with the target's own greedy tokens, up
    to `continue_to` output tokens and `max_length` in all. SpecForge's regeneration lever at a fraction of
    its cost: the prompts are the mined ones, the tokens the target's. Cached per sequence (its tokens,
    its limit, the target and its precision): only sequences never continued before are generated.

    Returns (info, feature rows): generation's forward passes already ran the target over every position
    of a continued sequence, so its hidden states become that sequence's features (draftwheel.training.eagle_features
    .feature_row) instead of a second forward over the same tokens: for the sequences generated (not
    those read from the cache), and none with `aux_layer_ids` None (continuations only)."""
    from draftwheel.training.target_completions import greedy_continuations

    room = continuation_room(seqs, eos, config)
    todo = list(room)
    if not todo:
        return {"continued_sequences": 0, "continued_tokens": 0}, {}
    rows: dict[int, tuple] = {}
    # room + 1 tokens: the model is then also fed the last token kept, so its features exist too.
    limits = [room[i] + 1 for i in todo]
    generated: list[int] = []  # the indices into todo that generation runs on: those not cached

    def keep(j: int, more: list[int], fed: tuple) -> None:
        """Sequence todo[generated[j]]'s feature row, made as soon as its batch is generated (half precision)."""
        i = todo[generated[j]]
        n = len(seqs.ids[i]) + len(more[:room[i]])
        if fed[0].shape[0] >= n:  # else the last kept token was never fed: the feature forward does it
            # From the logged sequence's last position on, each position's argmax is the token generation
            # chose next (all but an EOS's: nothing is chosen after it).
            rows[i] = row_from_states(target.model, fed, n, list(range(len(aux_layer_ids))),
                                      chosen=more, chosen_from=len(seqs.ids[i]) - 1)

    keep_states = {"on_states": keep, "state_layers": [*aux_layer_ids, -1]} if aux_layer_ids is not None else {}

    def generate(missing: list[int]) -> list[list[int]]:
        generated.extend(missing)
        return greedy_continuations(generation_model(target, config.target_bf16), target.tokenizer,
                                    [seqs.ids[todo[j]] for j in missing], [limits[j] for j in missing],
                                    batch_size=32, **keep_states)

    extra, made = cached_continuations(cache_root / "continuations", [target.model_id.sha256, config.target_bf16],
                                       [seqs.ids[i] for i in todo], limits, generate)
    added = 0
    for i, more in zip(todo, extra):
        seqs.ids[i] = seqs.ids[i] + more[:room[i]]
        added += len(more[:room[i]])
    return {"continued_sequences": len(todo), "continued_tokens": added,
            "continuations_cached": len(todo) - len(made), "features_from_generation": len(rows)}, rows


def add_prompt_variants(seqs: Sequences, tokenizer: Any, config: EagleConfig, info: dict[str, Any]) -> None:
    """Append (in place) the mined prompts cut 1..`prompt_variants` lines short and renamed `prompt_renames`
    times (draftwheel.training.prompt_variants), with no answer yet: the continuation step answers them with the target's greedy tokens, up to
    `continue_to`, in the same generation that lengthens the logged outputs."""
    if not (config.prompt_variants or config.prompt_renames):
        return
    prompts = [ids[:p] for ids, p in zip(seqs.ids, seqs.prompt_lens)]
    ids, slices = variant_prompts(prompts, seqs.slices, tokenizer, config.prompt_variants, config.max_length - 2,
                                  renames=config.prompt_renames, seed=config.seed)
    seqs.ids += ids
    seqs.prompt_lens += [len(v) for v in ids]
    seqs.slices += slices
    info["variant_sequences"] = len(ids)
    print(f"[eagle] prompt variants: {len(ids)} prompts cut 1..{config.prompt_variants} lines short "
          f"or renamed {config.prompt_renames}x from {len(prompts)} mined ones", flush=True)


def rehearsal_source(config: EagleConfig, student_dir: str | None) -> tuple[Path, int] | None:
    """(dataset dir, max_length) to rehearse: `config.rehearsal`, or with `auto` the data the warm start
    learned from (its own rehearsal source if it had one, which leads back to the bootstrap data), with
    the max_length it was loaded with, so its cached features are reused. None when there is none."""
    if not config.rehearsal or config.rehearsal_ratio == 0:
        return None
    if config.rehearsal != "auto":
        return Path(config.rehearsal), config.max_length
    info = common.read_training_info(student_dir) if student_dir else {}
    source = info.get("rehearsal") or info.get("dataset")
    path = common.recorded_path(info, source) if source else None
    if path is None or not path.is_dir():
        if student_dir:  # a warm start with nothing to rehearse: say so, it risks forgetting
            print(f"[eagle] WARNING: rehearsal: auto found no data the warm start learned from "
                  f"({path or 'none recorded in its training info'}): training without rehearsal, earlier "
                  "slices may be forgotten (the gate still judges them); set rehearsal: <dataset dir>", flush=True)
        return None
    return path, int(info.get("rehearsal_max_length") or info.get("config", {}).get("max_length")
                             or config.max_length)


def canary_sequences(target: Any, config: EagleConfig, cache_root: Path) -> Sequences:
    """The shadow gate's canary prompts with the target's greedy answers (generated once, cached): the
    slices the gate will always weigh, whatever the round mined."""
    from draftwheel.evaluation.shadow import DEFAULT_CANARY, load_canary
    from draftwheel.training.target_completions import target_traffic

    canary = load_canary(DEFAULT_CANARY)
    longest = max(c.max_new_tokens for c in canary)
    workload = [{"prompt": c.prompt, "slice": c.slice} for c in canary]
    rows, _ = cached_generation(cache_root / "canary", [workload, target.model_id.sha256, longest, config.target_bf16],
                                lambda: [{k: r[k] for k in ("prompt_token_ids", "completion_token_ids", "slice")}
                                         for r in target_traffic(generation_model(target, config.target_bf16),
                                                                 target.tokenizer, workload, longest,
                                                                 batch_size=16, progress=False)])
    seqs = Sequences([], [], [])
    for row, request in zip(rows, canary):
        seqs.add(row["prompt_token_ids"], row["completion_token_ids"][:request.max_new_tokens], row["slice"],
                 config.max_length)
    return seqs


EARLIER = "earlier-"  # slice-name prefix of the warm start's own hold-out in the probe (probe_parts)


def probe_parts(config: EagleConfig, holdout: Sequences | None, source: tuple[Path, int] | None, target: Any,
                cache_root: Path) -> list[Sequences]:
    """What each epoch is judged on, per slice, in two parts: the round's hold-out (the gain), and the
    standing part against forgetting -- the hold-out of the data the warm start learned from (the rehearsal
    source's sibling holdout/) and the canary prompts. Kept apart so each gets its own feature cache: the
    standing part is the same every round, and its features are computed once, not each round.

    The warm start's hold-out is judged under slices of its own (`EARLIER` + its slice: `earlier-chat`),
    so the round's hold-out and the canary group exactly as the gate's replay groups them (the gate
    replays those two, never the warm start's data): its 8 chat and 8 prose canary prompts pool, and a
    loss there is seen in training as the gate will see it, not diluted by the warm start's own chat."""
    standing = Sequences([], [], [])
    if source is not None and (source[0].parent / "holdout").is_dir():
        earlier = load_sequences(source[0].parent / "holdout", config.max_length, "output_token_ids",
                                 config.eval_max_samples)
        earlier.slices = [EARLIER + name for name in earlier.slices]
        standing.extend(earlier)
    if config.probe_canary:
        standing.extend(canary_sequences(target, config, cache_root))
    return [part for part in (holdout, standing) if part is not None and part.ids]


def probe_with_features(parts: list[Sequences], target: Any, aux_layer_ids: list[int], cache_root: Path,
                        bf16: bool) -> tuple[Sequences, Features]:
    """The probe parts joined, with their features (cached per sequence)."""
    probe = Sequences([], [], [])
    for part in parts:
        probe.extend(part)
    features = [cached_features(target.model, part.ids, aux_layer_ids, target.model_id.sha256, cache_root,
                                bf16=bf16)[0] for part in parts]
    return probe, join_features(features)


def seeded_sample(n: int, k: int, seed: int) -> list[int]:
    """`k` distinct indices of `range(n)`, the same for the same seed (a fixed sample: every epoch alike)."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:k].tolist()


def mined_epoch(mined: torch.utils.data.Dataset, passes: int, cap: int,
                seed: int) -> tuple[torch.utils.data.Dataset, list[int]]:
    """What one epoch sees of the mined set: `passes` times each sequence, but at most `cap` sequences in all
    (0 = no cap), so that a round's training time stops growing with its traffic: whole passes, then a fixed
    seeded sample of the set for the part of a pass left. Returns the dataset and the indices it holds."""
    n = len(mined)
    total = n * passes if not cap else min(n * passes, cap)
    whole, rest = divmod(total, n) if n else (0, 0)
    sample = seeded_sample(n, rest, seed)
    parts = [mined] * whole + ([torch.utils.data.Subset(mined, sample)] if rest else [])
    return torch.utils.data.ConcatDataset(parts or [mined]), list(range(n)) * whole + sample


def rehearsal_count(config: EagleConfig, n_requests: int, n_sequences: int, n_seen: int) -> int:
    """Rehearsal sequences for `n_requests` mined requests: `rehearsal_ratio` per request, scaled by the
    share of the mined set's passes an epoch sees (`n_seen` of `n_sequences` x `mined_passes`). Under
    `max_mined_per_epoch` the old data then shrinks with the new: their balance stays as configured, and
    an epoch stays bounded however much traffic a round mined."""
    share = min(1.0, n_seen / max(1, n_sequences * config.mined_passes))
    return round(config.rehearsal_ratio * n_requests * share)


def rehearsal_sample(config: EagleConfig, source: tuple[Path, int], seqs: Sequences, target: Any,
                     aux_layer_ids: list[int], cache_root: Path,
                     count: int) -> tuple[torch.utils.data.Dataset, dict[str, Any]]:
    """A fixed seeded sample of `count` of the source's sequences `seqs` (all, if fewer), with their
    features (computed, and cached per sequence, for the whole source)."""
    path, max_length = source
    features, hit = cached_features(target.model, seqs.ids, aux_layer_ids, target.model_id.sha256, cache_root,
                                    bf16=config.target_bf16)
    n = min(len(seqs.ids), count)
    picked = seeded_sample(len(seqs.ids), n, config.seed)
    tokens = sum(len(seqs.ids[i]) for i in picked)
    subset = torch.utils.data.Subset(EagleDataset(seqs, features, config.prompt_loss), picked)
    return subset, {"rehearsal": str(path), "rehearsal_max_length": max_length, "rehearsal_sequences": n,
                    "rehearsal_tokens": tokens, "rehearsal_cache_hit": hit}


class EagleDataset(torch.utils.data.Dataset):
    def __init__(self, seqs: Sequences, features: Features, prompt_loss: bool):
        self.seqs, self.features, self.prompt_loss = seqs, features, prompt_loss

    def __len__(self) -> int:
        return len(self.seqs.ids)

    def __getitem__(self, i: int) -> dict[str, Any]:
        aux, hidden, argmax = self.features.sequence(i)
        start = 0 if self.prompt_loss else max(self.seqs.prompt_lens[i] - 1, 0)
        return {"input_ids": self.seqs.ids[i], "aux": aux, "hidden": hidden, "argmax": argmax, "start": start,
                "weight": self.seqs.position_weights(i)}


# Batch widths are padded up to a multiple of this. A step whose width differs from the last ones costs
# far more than a step of a width already seen (most likely oneDNN's per-shape kernels and its bounded
# cache of them; a larger cache alone won back less), and a batch's width could take any of ~300 values.
# 80 steps of a shifted-code round: 53.7 s at any width, 41.1 s padded to 32 (16: 40.1 s, 64: 41.9 s), though
# padding adds positions. Padded positions are masked and sit after every real one, so they change no
# loss or gradient.
PAD_TO_MULTIPLE = 32


def collate(rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Right-padded batch (width: the longest row, rounded up to PAD_TO_MULTIPLE); `mask[b, p]` marks
    positions whose next-token prediction is learned, `weight[b, p]` weighs it in the loss."""
    width = -(-max(len(r["input_ids"]) for r in rows) // PAD_TO_MULTIPLE) * PAD_TO_MULTIPLE
    b = len(rows)
    batch = {"input_ids": torch.zeros(b, width, dtype=torch.long), "argmax": torch.zeros(b, width, dtype=torch.long),
             "mask": torch.zeros(b, width, dtype=torch.bool), "weight": torch.ones(b, width),
             "aux": torch.zeros(b, width, rows[0]["aux"].shape[-1]),
             "hidden": torch.zeros(b, width, rows[0]["hidden"].shape[-1])}
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        batch["input_ids"][i, :n] = torch.tensor(r["input_ids"])
        batch["argmax"][i, :n] = r["argmax"]
        batch["aux"][i, :n] = r["aux"].float()
        batch["hidden"][i, :n] = r["hidden"].float()
        batch["mask"][i, r["start"]: n - 1] = True  # the last position's next token is not in the data
        if "weight" in r:
            batch["weight"][i, :n] = r["weight"]
    return batch


class UnrolledDraft(torch.nn.Module):
    """The module the Trainer trains: the draft as its one submodule, the unrolled (training-time test)
    loss as its forward. Data parallelism (DDP, FSDP, DeepSpeed) synchronises gradients through the forward
    of the module it wraps, and the draft's own methods are serving's: a loss computed beside the wrapper
    trained every process on its own shard alone. The target's LM head is a plain attribute (frozen, never
    saved nor broadcast)."""

    def __init__(self, draft: Eagle3Draft, lm_head_weight: torch.Tensor, ttt_steps: int = 4, ttt_decay: float = 0.8,
                 ttt_chain_share: float = 1.0, teacher_temperature: float = 1.0, acceptance_weight: float = 0.0):
        super().__init__()
        self.draft, self.lm_head_weight = draft, lm_head_weight
        self.ttt_steps, self.ttt_decay, self.ttt_chain_share = ttt_steps, ttt_decay, ttt_chain_share
        self.teacher_temperature, self.acceptance_weight = teacher_temperature, acceptance_weight

    def forward(self, input_ids: torch.Tensor, aux: torch.Tensor, hidden: torch.Tensor, mask: torch.Tensor,
                weight: torch.Tensor | None = None) -> torch.Tensor:
        """One batch's loss (draftwheel.training.eagle_ttt.unrolled_loss)."""
        loss, _ = unrolled_loss(self.draft, input_ids, aux, hidden, mask, self.lm_head_weight, self.ttt_steps,
                                self.ttt_decay, self.ttt_chain_share, self.teacher_temperature, weight,
                                self.acceptance_weight)
        return loss


class EagleTrainer(Trainer):
    """A Trainer of an `UnrolledDraft`: its forward is the loss."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # Accelerate's mixed precision wraps `forward` in autocast only where it prepares the model: enter
        # it here too, or `bf16` trains in float32 (4-5x slower matmuls on an AMX CPU, measured).
        with self.accelerator.autocast():
            loss = model(inputs["input_ids"], inputs["aux"], inputs["hidden"], inputs["mask"], inputs.get("weight"))
        return (loss, {}) if return_outputs else loss

    def _get_train_sampler(self, train_dataset=None):
        args = self.args
        return GlobalBatchSampler(args.train_batch_size * args.gradient_accumulation_steps, args.world_size,
                                  self.train_dataset if train_dataset is None else train_dataset,
                                  torch.Generator().manual_seed(args.data_seed or 0))


class GlobalBatchSampler(LengthGroupedSampler):
    """Batches of similar lengths, grouped by the global batch (every process's batch of a step).

    Mined outputs run from a few dozen to max_length tokens, and a random batch pads every row to its
    longest (measured: about 40 % of the compute was padding). The global batch is what one process with
    `processes` times the batch would take, and it is dealt round-robin: under N processes each rank's
    batch holds every N-th of its sequences by length, so the ranks' batches weigh alike in the averaged
    gradient (each rank's loss is a mean over its own positions) and none waits long for another at the
    all-reduce. The order comes from a generator of its own, not the global RNG the main process alone
    also draws on (the per-epoch probe): accelerate hands every rank the main process's generator at each
    epoch, so all cut the same order, each into its own batches (accelerate's BatchSamplerShard: batch i
    to rank i mod N)."""

    def __init__(self, batch_size: int, processes: int, dataset: Any, generator: torch.Generator):
        super().__init__(batch_size * processes, dataset=dataset, generator=generator)
        self.processes = processes

    def __iter__(self):
        order = list(super().__iter__())
        for start in range(0, len(order), self.batch_size):
            batch = order[start:start + self.batch_size]
            for rank in range(self.processes):
                yield from batch[rank::self.processes]


def _chain_totals(draft: Eagle3Draft, dataset: EagleDataset, indices: list[int], k: int,
                  batch_size: int, min_path_prob: float = 0.0) -> tuple[list[int], int, list[int]]:
    """(chains accepted per position, chains counted, [tokens, steps] of serving's walk with its chain cut)
    over `indices`."""
    totals, counted, walk = [0] * k, 0, [0, 0]
    for start in range(0, len(indices), batch_size):
        batch = collate([dataset[i] for i in indices[start:start + batch_size]])
        logits = unroll(draft, batch["input_ids"], batch["aux"], k)
        accepted, n = chain_acceptance(logits, batch["argmax"], draft, batch["mask"])
        totals = [a + b for a, b in zip(totals, accepted)]
        counted += n
        walk = [a + b for a, b in zip(walk, served_walk(logits, batch["argmax"], draft, batch["mask"],
                                                         min_path_prob))]
    return totals, counted, walk


def _served_mal(walk: list[int]) -> float:
    return walk[0] / walk[1] if walk[1] else 1.0


def evaluate_chains(draft: Eagle3Draft, dataset: EagleDataset, k: int, batch_size: int = 8,
                    bf16: bool = False, min_path_prob: float = 0.0) -> dict[str, float]:
    """Teacher-forced greedy acceptance per chain position and the implied mean accepted length at k,
    overall and per slice (`slice.<name>.implied_mal`), and beside it the mean accepted length serving's
    own walk over the same chains gives, with serving's chain cut `min_path_prob` (`served_mal`: what the
    shadow gate measures of the draft alone; eagle_ttt.served_walk), and the gap between the two
    (`walk_gap` = implied - served: what the teacher-forced figure promises that serving does not get).
    With `bf16`, under bfloat16 autocast, the
    precision the engine serves in on AMX CPUs (and ~4x faster matmuls there)."""
    by_slice: dict[str, list[int]] = {}
    for i, name in enumerate(dataset.seqs.slices):
        by_slice.setdefault(name, []).append(i)
    result: dict[str, float] = {}
    totals, counted, walk = [0] * k, 0, [0, 0]
    was_training = draft.training
    draft.eval()
    with torch.no_grad(), torch.autocast(draft.fc.weight.device.type, dtype=torch.bfloat16, enabled=bf16):
        for name, indices in sorted(by_slice.items()):
            slice_totals, slice_counted, slice_walk = _chain_totals(draft, dataset, indices, k, batch_size,
                                                                    min_path_prob)
            result[slice_key(name, METRIC)] = implied_mal(slice_totals, slice_counted)
            result[slice_key(name, SERVED)] = _served_mal(slice_walk)
            totals = [a + b for a, b in zip(totals, slice_totals)]
            counted += slice_counted
            walk = [a + b for a, b in zip(walk, slice_walk)]
    draft.train(was_training)
    result.update({METRIC: implied_mal(totals, counted), SERVED: _served_mal(walk), "chains": float(counted)})
    result["walk_gap"] = result[METRIC] - result[SERVED]
    previous = counted
    for s, value in enumerate(totals):  # conditional acceptance at chain position s+1
        result[f"acceptance_pos{s + 1}"] = value / previous if previous else 0.0
        previous = value
    return result


def answer_chains(target: Any, draft: Eagle3Draft, prompt_ids: list[int], answer_ids: list[int],
                  k: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """One served answer teacher-forced as the probe sees it: (the draft's k step logits, the target's
    greedy reference[1, T], the answer's mask[1, T]), for chain_acceptance and served_walk."""
    seqs = Sequences([list(prompt_ids) + list(answer_ids)], [len(prompt_ids)], ["answer"])
    features = compute_features(target, seqs.ids, list(draft.c.aux_layer_ids), progress=False)
    batch = collate([EagleDataset(seqs, features, prompt_loss=False)[0]])
    with torch.no_grad():
        logits = unroll(draft, batch["input_ids"], batch["aux"], k)
    return logits, batch["argmax"], batch["mask"]


class ChainCallback(EpochSelectionCallback):
    """Per-epoch evaluation of the draft's chains on the probe (the round's hold-out and the slices it
    must not forget), keeping the epoch best for the shadow gate (draftwheel.training.evaluate.EpochSelection) by
    `metric`: METRIC (default) or SERVED."""

    def __init__(self, dataset: EagleDataset, k: int, tracker: Any, selection: Any, bf16: bool = False,
                 metric: str = METRIC, min_path_prob: float = 0.0):
        super().__init__(dataset.seqs.slices, tracker, selection)
        self.dataset, self.k, self.bf16, self.metric = dataset, k, bf16, metric
        self.min_path_prob = min_path_prob

    def measure(self, model: UnrolledDraft) -> dict[str, float]:
        started = time.perf_counter()
        result = evaluate_chains(model.draft, self.dataset, self.k, bf16=self.bf16, min_path_prob=self.min_path_prob)
        slices = " ".join(f"{name} {result[slice_key(name, METRIC)]:.3f}" for name in sorted(self.counts))
        served = " ".join(f"{name} {result[slice_key(name, SERVED)]:.3f}" for name in sorted(self.counts))
        print(f"[eagle] implied mean accepted length {result[METRIC]:.3f} (k={self.k}; {slices}); serving's walk "
              f"(cut {self.min_path_prob:g}) {result[SERVED]:.3f} ({served}), gap {result['walk_gap']:+.3f}; "
              "acceptance by "
              "position " + " ".join(f"{result[f'acceptance_pos{s + 1}']:.2f}" for s in range(self.k))
              + f" [probe {common.seconds_since(started):.1f} s]", flush=True)
        return result


def load_warm_start(config: EagleConfig) -> tuple[Eagle3Draft | None, dict[str, Any]]:
    """The eagle3 draft `config.student` names, or None (a fresh draft) when it is none or not there."""
    from draftwheel.serving.loading import load_model

    if config.student:
        try:
            loaded = load_model(config.student)
            if loaded.kind == "eagle3":
                return loaded.model, {"warm_start": True, "student_dir": str(loaded.path)}
        except (FileNotFoundError, OSError, ValueError) as exc:
            print(f"[eagle] no warm start from {config.student}: {exc}")
    return None, {"warm_start": False}


def aux_layers(config: EagleConfig, target: Any, warm: Eagle3Draft | None) -> list[int]:
    """The target layers the draft reads: the warm start's, else the config's or EAGLE-3's default."""
    if warm is not None:
        return list(warm.c.aux_layer_ids)
    return list(config.aux_layer_ids) or default_aux_layer_ids(target.model.config.num_hidden_layers)


def verifier_id(config: EagleConfig, target: Any) -> str:
    """The target's Hugging Face id, recorded as the draft's verifier (what vLLM loads the target by), or
    "" when unknown: a local dir other than the reference is named by `draftwheel export --verifier`."""
    return hub_id(config.target) or hub_id(target.path)


def prepare_draft(config: EagleConfig, target: Any, counts: torch.Tensor, eos: list[int],
                  warm: Eagle3Draft | None, rank_counts: torch.Tensor | None = None) -> tuple[Eagle3Draft, dict]:
    """The warm start when there is one, else a fresh draft; a new vocabulary when the warm start's
    covers less than `min_vocab_coverage` of the outputs (`counts`: the mined data's). A new vocabulary
    ranks tokens by `rank_counts` (default `counts`)."""
    info: dict[str, Any] = {}
    rank_counts = counts if rank_counts is None else rank_counts
    if warm is None:
        draft = fresh_draft(target.model, config, rank_counts, target.model_id.sha256, eos)
        info["vocab"] = "new"
    else:
        info["warm_vocab_coverage"] = coverage(warm.t2d, counts)
        if info["warm_vocab_coverage"] < config.min_vocab_coverage:
            draft, info["vocab"] = revocab(warm, rank_counts, config.draft_vocab_size, target.model, eos), "rebuilt"
        else:
            draft, info["vocab"] = warm, "kept"
        draft.c.target_sha256 = target.model_id.sha256
    info["vocab_coverage_train"] = coverage(draft.t2d, counts)
    return draft.attach_target(target.model), info


@dataclass
class Prepared:
    """What a training run reads, prepared by `prepare`."""

    target: Any                  # the loaded target (draftwheel.serving.loading.LoadedModel)
    draft: Eagle3Draft           # the draft to train, attached to the target
    train_set: torch.utils.data.Dataset
    train_tokens: int            # tokens one epoch of `train_set` holds
    probe: EagleDataset | None   # what each epoch is judged on (None: no hold-out, no canary)
    dataset_dir: Path
    info: dict[str, Any]         # figures for the training info (vocabulary, caches, rehearsal, ...)


def feature_cache_root(setting: str = "") -> Path:
    """The cache of the target's features, continuations and canary answers: `feature_cache`, else under the state dir."""
    return Path(setting) if setting else home.state_dir() / "cache" / "eagle-features"


def prepare(config: EagleConfig) -> Prepared:
    """The target, the draft (warm start or fresh, its vocabulary), the training set with the target's
    features (continued, varied, rehearsed as configured) and the probe with theirs. Every product of the
    target is cached on disk (features, continuations, canary answers), so a second call on the same data
    reads them: under several processes the main one prepares first and the others read its caches."""
    from draftwheel.serving.engine.engine import eos_token_ids
    from draftwheel.serving.loading import load_model, resolve_target

    dataset_dir = Path(config.dataset) if config.dataset else home.datasets_dir() / "distill"
    holdout_dir = Path(config.holdout) if config.holdout else dataset_dir.parent / "holdout"
    began = time.time()
    target = load_model(resolve_target(config.target, config.student))
    target.model.requires_grad_(False)
    train_seqs = load_sequences(dataset_dir, config.max_length, residual_floor=config.residual_floor)
    cache_root = feature_cache_root(config.feature_cache)
    eos = eos_token_ids(target)
    warm, info = load_warm_start(config)
    aux_layer_ids = aux_layers(config, target, warm)
    n_requests = len(train_seqs.ids)  # the mined requests: the rehearsal sample is sized by them
    started = time.perf_counter()
    add_prompt_variants(train_seqs, target.tokenizer, config, info)
    lengthened, known = lengthen(train_seqs, target, eos, config, cache_root, aux_layer_ids) \
        if config.continue_to else ({}, {})
    info.update(lengthened, lengthen_s=common.seconds_since(started))
    vocab = target.model.config.vocab_size
    counts = output_counts(train_seqs, vocab)
    source = rehearsal_source(config, info.get("student_dir"))
    info["rehearsal_missing"] = bool(config.rehearsal == "auto" and config.rehearsal_ratio
                                     and info.get("student_dir") and source is None)
    rehearsing = source is not None and source[0].resolve() != dataset_dir.resolve()
    rehearsal_seqs = load_sequences(*source) if rehearsing else None
    # A new vocabulary is ranked by the outputs of the mined data and of the data the warm start learned
    # from: ranked by the mined data alone, the old slices' tokens only filled the leftover rows in no
    # particular order, and a shifted-code round dropped 8 % of the prose canary's tokens (0.891 -> 0.807).
    rank_counts = counts + output_counts(rehearsal_seqs, vocab) if rehearsing else counts
    draft, vocab_info = prepare_draft(config, target, counts, sorted(eos), warm, rank_counts)
    draft.c.verifier_name = verifier_id(config, target)
    info.update(vocab_info)
    started = time.perf_counter()
    features, hit = cached_features(target.model, train_seqs.ids, draft.c.aux_layer_ids, target.model_id.sha256,
                                    cache_root, bf16=config.target_bf16, known=known)
    info.update(feature_cache_hit=hit, feature_s=common.seconds_since(started))
    # A round's mined set is small next to its rehearsal sample: more passes over it per epoch give the
    # new traffic more steps without more epochs, so the rehearsal sample, the per-epoch probe and the
    # patience of epoch selection stay as they are (more epochs instead stopped the demo's round early).
    train_set, picked = mined_epoch(EagleDataset(train_seqs, features, config.prompt_loss), config.mined_passes,
                                    config.max_mined_per_epoch, config.seed)
    train_tokens = sum(len(train_seqs.ids[i]) for i in picked)
    info["mined_passes_effective"] = round(len(picked) / max(1, len(train_seqs.ids)), 3)
    if rehearsing:
        count = rehearsal_count(config, n_requests, len(train_seqs.ids), len(picked))
        rehearsal, rehearsal_info = rehearsal_sample(config, source, rehearsal_seqs, target, draft.c.aux_layer_ids,
                                                     cache_root, count)
        train_set, train_tokens = torch.utils.data.ConcatDataset([train_set, rehearsal]), \
            train_tokens + rehearsal_info["rehearsal_tokens"]
        info.update(rehearsal_info)
        print(f"[eagle] rehearsal: {rehearsal_info['rehearsal_sequences']} sequences of {source[0]}", flush=True)
    hold_seqs = None
    if holdout_dir.is_dir():
        hold_seqs = load_sequences(holdout_dir, config.max_length, "output_token_ids", config.eval_max_samples)
        info["vocab_coverage_holdout"] = coverage(draft.t2d, output_counts(hold_seqs, vocab))
    parts = probe_parts(config, hold_seqs, source, target, cache_root)
    probe = None
    if parts:
        probe_seqs, probe_features = probe_with_features(parts, target, draft.c.aux_layer_ids, cache_root,
                                                           config.target_bf16)
        probe = EagleDataset(probe_seqs, probe_features, prompt_loss=False)
    pruned = cache_budget.prune(cache_root, int(config.cache_max_gb * 2**30), keep_since=began - 1.0)
    info.update(cache_bytes=pruned.kept_bytes, cache_evicted_files=pruned.files)
    return Prepared(target, draft, train_set, train_tokens, probe, dataset_dir, info)


def train_eagle(config: EagleConfig, tracker: Any = None) -> Path:
    """Train an EAGLE-3 draft; return the saved candidate dir (speculators format). Under several processes
    (`accelerate launch`) each trains on its shard with gradients all-reduced, and rank 0 alone judges the
    epochs, logs to MLflow and writes the candidate."""
    out_dir = common.resolve_output_dir(config.output_dir, "eagle")
    # Every parameter takes part in every step: DDP need not look for unused ones. (Batches: grouped by
    # length, EagleTrainer._get_train_sampler.)
    args = TrainingArguments(**common.training_arguments_kwargs(config, out_dir), bf16=config.bf16,
                             ddp_find_unused_parameters=False)
    tracker = common.process_tracker(tracker, config.tracking, args)
    with args.main_process_first(local=False, desc="the target's features"):
        data = prepare(config)
    target, draft, info = data.target, data.draft, data.info
    evaluation = None
    if data.probe is not None:
        selection = config.epoch_selection()
        if not info.get("warm_start"):  # a fresh draft's start is no draft at all: nothing to mix with
            selection = dataclasses.replace(selection, mixes=())
        evaluation = ChainCallback(data.probe, config.eval_k, tracker, selection, config.bf16,
                                   config.select_on, config.eval_min_path_prob)
    draft.train()
    model = UnrolledDraft(draft, target.model.get_output_embeddings().weight.detach(), ttt_steps=config.ttt_steps,
                          ttt_decay=config.ttt_decay, ttt_chain_share=config.ttt_chain_share,
                          teacher_temperature=config.teacher_temperature,
                          acceptance_weight=config.acceptance_weight)
    trainer = EagleTrainer(model=model, args=args, train_dataset=data.train_set, data_collator=collate,
                           callbacks=[TrackerCallback(tracker), *([evaluation] if evaluation else [])])
    with tracker.run("train-eagle", nested=True, tags={"stage": "eagle", "draft_kind": "eagle3"}):
        tracker.log_params({**to_dict(config), "params_trainable": sum(p.numel() for p in draft.parameters()),
                            "processes": args.world_size})
        result = trainer.train()  # the ChainCallback puts back the epoch best for the gate at the end
        tokens = data.train_tokens * trainer.state.epoch
        metrics = {"train_loss": result.training_loss, "train_runtime_s": result.metrics["train_runtime"],
                   "train_tokens": tokens, "train_tokens_per_s": tokens / max(result.metrics["train_runtime"], 1e-9),
                   "steps": trainer.state.global_step,
                   **{k: float(v) for k, v in info.items() if isinstance(v, (int, float, bool))}}
        history = evaluation.history if evaluation else []
        if history:  # the last evaluation describes the saved weights
            metrics.update({f"eval_{k}": v for k, v in history[-1].items()})
        if config.calibrate_confidence and data.probe is not None and common.is_main_process(args):
            fit = fit_temperature(draft, data.probe, config.eval_k, collate, bf16=config.bf16)
            draft.c = dataclasses.replace(draft.c, confidence_temperature=fit["confidence_temperature"])
            metrics.update({f"calibration_{k}": v for k, v in fit.items()})
            print(describe(fit), flush=True)
        common.log_summary(tracker, metrics, trainer.state.global_step)
        if common.is_main_process(args):
            save_eagle3(draft.eval(), out_dir, target.tokenizer)
            common.write_training_info(out_dir, "eagle", config, metrics,
                                       {"target": str(target.path), "target_sha256": target.model_id.sha256,
                                        "draft_kind": "eagle3", "vocab": info.get("vocab"),
                                        "dataset": str(data.dataset_dir), "eval_history": history,
                                        "epoch_selection": evaluation.summary() if evaluation else None,
                                        "processes": args.world_size,
                                        **{k: info[k] for k in ("rehearsal", "rehearsal_max_length") if k in info}})
            tracker.log_artifact(out_dir / common.INFO_FILE)
    return out_dir


def main(argv: list[str] | None = None) -> int:
    """Entry point for `python -m draftwheel.training.eagle_train` / `accelerate launch -m draftwheel.training.eagle_train`."""
    return common.module_main(train_eagle, EagleConfig, "Train an EAGLE-3 draft on the target's features.",
                              "configs/eagle.yaml", argv)


if __name__ == "__main__":
    raise SystemExit(main())
