"""`draftwheel bootstrap`: a target and its v0 draft, registered as champion.

Steps, each skipped when its result already exists (so re-running is cheap and safe):
1. the target: `target` (a model dir or a hub id), else the one the champion was trained for, else the
   reference target (`draftwheel.serving.loading.resolve_target`; the reference is converted offline once,
   sha256-checked);
2. general traffic: the target's own greedy completions of `chat` workload prompts (`draftwheel.training.target_completions`),
   saved as distill/ + holdout/ datasets (with its top-k log-probs for an `lm` draft);
3. the v0 draft, by `draft_kind`:
   - `eagle3` (default): an EAGLE-3 draft (draftwheel.serving.engine.eagle) trained with `draftwheel.training.eagle_train` on those
     completions plus offline text (stdlib docstrings, teacher-forced: a batched target forward is far
     cheaper on CPU than generating);
   - `lm`: a shallow Llama whose decoder layers are copies of chosen target layers and whose
     embeddings, final norm and LM head are the target's (embeddings/head frozen during training),
     briefly distilled on that traffic (`draftwheel.training.distill`);
4. registration as `draftwheel-draft`, tagged with the target (weights sha256, dir, hub id:
   `draftwheel.serving.loading.target_tags`, which every later command given no target follows) and the
   draft kind, and promotion to `champion`, unless the champion was trained for this target already. A
   champion trained for another target becomes `previous` (`draftwheel rollback` returns to it).

Traffic and the v0 are kept per target (`<state>/datasets/bootstrap/<settings>-<target sha>`,
`<state>/models/<draft_name>-<target sha>`), so bootstrapping a second target never reuses the first's.

It does not serve or mine; the CLI and the Prefect bootstrap flow call `bootstrap()`.
"""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftwheel import home
from draftwheel.config import to_dict
from draftwheel.training import common


DRAFT_KINDS = ("eagle3", "lm")


@dataclass
class BootstrapConfig:
    """v0 draft settings; see configs/bootstrap.yaml."""

    target: str = ""             # target model dir or hub id; "" = the champion's target, else the reference target
    draft_kind: str = "eagle3"   # eagle3 (one layer over the target's features) | lm (a small causal LM)
    draft_name: str = "v0-draft"  # dir under <state>/models for the v0 draft (suffixed with the target's sha256)
    init_layers: list[int] = field(default_factory=lambda: [0, 1])  # target layers copied into the draft
    workload: str = "chat"       # draftwheel.mining.workloads name for the general traffic
    n_prompts: int = 256         # training prompts (target completions)
    holdout_prompts: int = 16    # hold-out prompts for the per-epoch evaluation
    max_new_tokens: int = 128    # target completion length
    gen_batch_size: int = 32     # prompts per batched target generation
    top_k: int = 64              # lm: teacher log-probs kept per generated position (eagle3 reads features instead)
    seed: int = 0                # workload sampling seed
    loss: str = "fkl"            # distillation loss (draftwheel.training.losses)
    learning_rate: float = 5e-3  # training learning rate (cosine decay)
    epochs: float = 16.0         # training epochs (eagle3 hold-out MAL rises to ~epoch 14)
    batch_size: int = 8          # training batch size
    max_length: int = 384        # tokens per training sequence
    text_sequences: int = 64     # eagle3: extra teacher-forced text (stdlib docstrings, the `prose` workload)
    sampled_completions: int = 0  # eagle3: per training prompt, this many more completions sampled at sample_temperature
    sample_temperature: float = 0.8  # (more of the target's own text around the same prompts; its teacher stays the target)
    ttt_steps: int = 3           # eagle3: training-time-test unroll depth
    bf16: bool | str = False     # eagle3: train under bfloat16 (~1.7x faster on AMX, a weaker v0; auto = only where fast)
    target_bf16: bool | str = "auto"  # eagle3: generate the completions and features in bfloat16; auto = with bf16, where the target serves in it
    register: bool = True        # register the draft and make it `champion` (unless the champion is for this target)
    tracking: bool = True        # log the distillation run to MLflow

    @property
    def bf16_eagle(self) -> bool:
        """Does the target generate in bfloat16? Only for the eagle3 v0 (the lm v0 distils float32 top-k
        log-probs)."""
        return self.draft_kind == "eagle3" and self.target_bf16

    def __post_init__(self) -> None:
        from draftwheel.serving.engine.precision import resolve_bf16, resolve_target_bf16

        self.bf16 = resolve_bf16(self.bf16)  # auto: bfloat16 only on CPUs where it is fast (AMX, AVX-512 BF16)
        self.target_bf16 = resolve_target_bf16(self.target_bf16, self.bf16)
        common.require(self.draft_kind in DRAFT_KINDS, "draft_kind",
                       f"must be one of {', '.join(DRAFT_KINDS)}, got {self.draft_kind!r}")
        common.require(self.text_sequences >= 0, "text_sequences", f"must be >= 0, got {self.text_sequences}")
        common.require(self.ttt_steps >= 1, "ttt_steps", f"must be >= 1, got {self.ttt_steps}")
        common.require(bool(self.init_layers), "init_layers", "must name at least one target layer")
        common.require(bool(self.draft_name) and "/" not in self.draft_name, "draft_name",
                        f"must be a plain dir name, got {self.draft_name!r}")
        for name in ("n_prompts", "max_new_tokens", "gen_batch_size", "batch_size", "max_length"):
            common.require(getattr(self, name) >= 1, name, f"must be >= 1, got {getattr(self, name)}")
        common.require(self.holdout_prompts >= 0, "holdout_prompts", f"must be >= 0, got {self.holdout_prompts}")
        common.require(self.learning_rate > 0, "learning_rate", f"must be > 0, got {self.learning_rate}")
        common.require(self.epochs > 0, "epochs", f"must be > 0, got {self.epochs}")
        common.require(self.sampled_completions >= 0, "sampled_completions",
                       f"must be >= 0, got {self.sampled_completions}")
        common.require(self.sample_temperature > 0, "sample_temperature", f"must be > 0, got {self.sample_temperature}")


def init_draft_from_target(target: Any, layers: list[int]) -> Any:
    """A Llama-family draft with `len(layers)` decoder layers copied from `target` (negative indices count
    from the end) and the target's embeddings, final norm and LM head."""
    n = target.config.num_hidden_layers
    if any(not -n <= i < n for i in layers):
        raise ValueError(f"init_layers: {layers} out of range for a {n}-layer target")
    chosen = [i % n for i in layers]
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = len(chosen)
    if getattr(config, "layer_types", None):
        config.layer_types = [config.layer_types[i] for i in chosen]
    draft = type(target)(config)
    state: dict[str, Any] = {}
    for name, tensor in target.state_dict().items():
        if not name.startswith("model.layers."):
            state[name] = tensor.clone()
            continue
        source = int(name.split(".")[2])
        for position, layer in enumerate(chosen):
            if layer == source:
                state[name.replace(f"model.layers.{source}.", f"model.layers.{position}.", 1)] = tensor.clone()
    draft.load_state_dict(state)
    draft.generation_config = copy.deepcopy(target.generation_config)
    return draft.eval()


def _traffic(config: BootstrapConfig, target: Any, data_dir: Path, workload: list[dict] | None) -> dict[str, Path]:
    from draftwheel.training.target_completions import save_traffic, target_traffic

    if (data_dir / "distill" / "dataset_info.json").is_file():
        print(f"bootstrap: traffic exists at {data_dir}", flush=True)
        return {"distill": data_dir / "distill", "holdout": data_dir / "holdout"}
    if workload is None:
        from draftwheel.mining.workloads import build_workload

        workload = build_workload(config.workload, config.n_prompts + config.holdout_prompts, config.seed)
    print(f"bootstrap: target completions of {len(workload)} {config.workload} prompts", flush=True)
    from draftwheel.training.eagle_train import generation_model

    # The lm v0 distils cached top-k log-probs, kept in float32; the eagle3 v0 reads only the token ids
    # (its teacher comes from the feature forward), so a bfloat16 copy may generate them (135 s instead of
    # ~180 s for the 272 bootstrap prompts, measured).
    model = generation_model(target, config.bf16_eagle)
    rows = target_traffic(model, target.tokenizer, workload, config.max_new_tokens, config.gen_batch_size,
                          top_k=0 if config.draft_kind == "eagle3" else config.top_k,
                          **_feature_keeper(config, target))
    train, holdout = rows[: config.n_prompts], rows[config.n_prompts:]
    for i in range(config.sampled_completions if config.draft_kind == "eagle3" else 0):
        print(f"bootstrap: sampled completions {i + 1}/{config.sampled_completions} (temperature "
              f"{config.sample_temperature:g})", flush=True)
        train += target_traffic(model, target.tokenizer, workload[: config.n_prompts], config.max_new_tokens,
                                config.gen_batch_size, temperature=config.sample_temperature, seed=config.seed + i)
    tmp = data_dir.with_name(data_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    save_traffic(train, holdout, tmp)
    tmp.rename(data_dir)  # all-or-nothing: an interrupted run never leaves half a dataset behind
    return {"distill": data_dir / "distill", "holdout": data_dir / "holdout"}


def _feature_keeper(config: BootstrapConfig, target: Any) -> dict[str, Any]:
    """For the eagle3 v0: `target_traffic`'s arguments that store generation's hidden states as the feature
    rows its training reads (draftwheel.training.eagle_features, the same key), so the training's own
    teacher-forced forward runs over the offline text alone, not again over every completion."""
    if config.draft_kind != "eagle3":
        return {}
    from draftwheel.serving.engine.eagle import default_aux_layer_ids
    from draftwheel.training.data import join_and_truncate
    from draftwheel.training.eagle_features import row_from_states, row_path, store_row
    from draftwheel.training.eagle_train import feature_cache_root

    aux = default_aux_layer_ids(target.model.config.num_hidden_layers)  # a fresh v0 reads EAGLE-3's layers
    root, sha = feature_cache_root(), target.model_id.sha256

    def keep(prompt: list[int], generated: list[int], states: tuple[Any, ...]) -> None:
        ids, kept = join_and_truncate(prompt, generated[: config.max_new_tokens], config.max_length)
        if kept != len(prompt):
            return  # a prompt cut from the left is another sequence: the training computes its features
        # From the prompt's last position on, each position's argmax is the token generation chose next.
        row = row_from_states(target.model, states, len(ids), list(range(len(aux))), chosen=generated,
                              chosen_from=len(prompt) - 1)
        store_row(row_path(root, ids, sha, aux, config.target_bf16), row)

    return {"on_states": keep, "state_layers": [*aux, -1]}


def text_rows(tokenizer: Any, n: int, seed: int, max_length: int) -> list[dict]:
    """Offline text as extra eagle3 data: stdlib docstring paragraphs (the `prose` workload's source), the
    whole text a "completion", so every position teaches the draft the target's prediction there."""
    from draftwheel.mining.workloads import build_workload

    rows = []
    for item in build_workload("prose", n, seed):
        ids = tokenizer(item["prompt"])["input_ids"][:max_length]
        rows.append({"prompt": "", "completion": item["prompt"], "prompt_token_ids": ids[:1],
                     "completion_token_ids": ids[1:], "slice": "text", "weight": 1.0})
    return rows


def _build_eagle_draft(config: BootstrapConfig, target: Any, data: dict[str, Path], draft_dir: Path,
                       tracker: Any) -> None:
    """The v0 eagle3 draft: fresh (its head starts as the target's, restricted to the mined vocabulary),
    trained on the target's completions plus offline text."""
    from datasets import concatenate_datasets, load_from_disk

    from draftwheel.training.eagle_train import EagleConfig, train_eagle
    from draftwheel.training.target_completions import save_rows

    dataset = data["distill"]
    if config.text_sequences:
        mixed = dataset.with_name("distill+text")
        if not (mixed / "dataset_info.json").is_file():
            text = save_rows(text_rows(target.tokenizer, config.text_sequences, config.seed, config.max_length),
                             mixed.with_name("text"))
            completions = load_from_disk(str(dataset))
            columns = load_from_disk(str(text)).column_names
            concatenate_datasets([completions.select_columns(columns),
                                  load_from_disk(str(text))]).save_to_disk(str(mixed))
        dataset = mixed
    tmp = draft_dir.with_name(draft_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    eagle = EagleConfig(student="", target=str(target.path), dataset=str(dataset),
                        holdout=str(data["holdout"]) if data["holdout"].is_dir() else "", output_dir=str(tmp),
                        learning_rate=config.learning_rate, epochs=config.epochs, batch_size=config.batch_size,
                        max_length=config.max_length, ttt_steps=config.ttt_steps, tracking=config.tracking,
                        eval_max_samples=config.holdout_prompts, seed=config.seed, logging_steps=5, bf16=config.bf16,
                        target_bf16=config.target_bf16)
    train_eagle(eagle, tracker)
    tmp.rename(draft_dir)


def _build_draft(config: BootstrapConfig, target: Any, data: dict[str, Path], draft_dir: Path, tracker: Any) -> None:
    from draftwheel.training.distill import DistillConfig, train_distill

    if config.draft_kind == "eagle3":
        return _build_eagle_draft(config, target, data, draft_dir, tracker)

    init_dir = draft_dir.with_name(f".{draft_dir.name}-init")
    common.save_candidate(init_draft_from_target(target.model, config.init_layers), target.tokenizer, init_dir,
                          "bootstrap-init", config, {})
    tmp = draft_dir.with_name(draft_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    distill = DistillConfig(
        student=str(init_dir), target=str(target.path), dataset=str(data["distill"]),
        holdout=str(data["holdout"]) if data["holdout"].is_dir() else "", output_dir=str(tmp),
        loss=config.loss, teacher_mode="cached", learning_rate=config.learning_rate, epochs=config.epochs,
        batch_size=config.batch_size, max_length=config.max_length, freeze_embeddings=True,
        tracking=config.tracking, eval_max_samples=config.holdout_prompts, seed=config.seed, logging_steps=5,
    )
    train_distill(distill, tracker)
    tmp.rename(draft_dir)
    shutil.rmtree(init_dir, ignore_errors=True)


def _register(config: BootstrapConfig, draft_dir: Path, target: Any) -> dict[str, Any]:
    """Register the v0 draft, tagged with where its target is, and make it champion through
    `draftwheel.registry` (the path every promotion takes), unless the champion was trained for this target."""
    from draftwheel import registry, tracking
    from draftwheel.registry_names import CHAMPION, STAGE_TAG, TRAINING_CONFIG_TAG, not_trained_for, trained_for
    from draftwheel.serving.loading import target_tags

    sha = target.model_id.sha256
    existing = next((row for row in tracking.list_versions() if CHAMPION in row["aliases"]), None)
    if existing is not None and trained_for(existing["tags"], sha):
        print(f"bootstrap: the champion (version {existing['version']}) is trained for this target; not registering",
              flush=True)
        return {"version": existing["version"], "registered": False}
    info = common.read_training_info(draft_dir)
    version = registry.register_version(draft_dir, config.draft_kind, {
        **target_tags(config.target or target.path, sha, target.path), STAGE_TAG: "bootstrap",
        TRAINING_CONFIG_TAG: to_dict(config), "metrics": info.get("metrics", {})})
    registry.promote(version, target_sha=sha)
    print(f"bootstrap: registered v0 draft as version {version} (champion)", flush=True)
    if existing is not None:
        print(f"bootstrap: the champion was version {existing['version']}, "
              f"{not_trained_for(existing['tags'], sha, 'this target')}; it is `previous` now "
              f"(`draftwheel rollback` returns to it)", flush=True)
    return {"version": version, "registered": True}


def bootstrap(config: BootstrapConfig | None = None, workload: list[dict] | None = None) -> dict[str, Any]:
    """The target + its v0 draft (+ registration). `workload` overrides the generated prompts (tests)."""
    from draftwheel.tracking import get_tracker
    from draftwheel.serving.loading import load_model, resolve_target

    config = config or BootstrapConfig()
    home.apply_offline_defaults()
    target = load_model(resolve_target(config.target))
    sha = target.model_id.sha256
    draft_dir = home.models_dir() / f"{config.draft_name}-{sha[:12]}"
    result: dict[str, Any] = {"target_dir": str(target.path), "draft_dir": str(draft_dir)}
    if (draft_dir / common.INFO_FILE).is_file():
        print(f"bootstrap: v0 draft exists at {draft_dir}", flush=True)
        result["built"] = False
    else:
        # Keyed by what shapes the traffic, so a changed config never silently reuses stale data.
        key = (f"{config.workload}-{config.n_prompts}-{config.holdout_prompts}-{config.max_new_tokens}-{config.seed}"
               f"-{config.draft_kind}" + ("-bf16" if config.bf16_eagle else "")
               + (f"-s{config.sampled_completions}t{config.sample_temperature:g}" if config.sampled_completions else "")
               + f"-{sha[:12]}")
        data = _traffic(config, target, home.datasets_dir() / "bootstrap" / key, workload)
        _build_draft(config, target, data, draft_dir, get_tracker(config.tracking))
        result["built"] = True
    result["metrics"] = common.read_training_info(draft_dir).get("metrics", {})
    if config.register:
        result.update(_register(config, draft_dir, target))
    return result
