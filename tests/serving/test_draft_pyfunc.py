"""Registered drafts are MLflow models: `mlflow.pyfunc.load_model` loads a version and `predict` proposes what
the engine's draft would, while serving keeps loading exactly the files it loaded before.

Tiny models built here: a 2-layer target, an `lm` draft, a random `eagle3` draft and random Medusa heads for
it, registered through `draftwheel.registry.register_version` with the target's place recorded
(`draftwheel.serving.loading.target_tags`). The engine's own proposals are read off its records: each
greedy step lists the tokens its draft proposed, after the prompt and every token emitted before the step;
the pyfunc model, given that context as token ids, must propose the same tokens.

Versions registered before drafts were MLflow models (their artifacts are the draft's files alone) are
built here the way draftwheel registered them, with MLflow's own client, and must still resolve, serve, hot
reload, promote, roll back, show in status and export.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from draftwheel import registry, tracking
from draftwheel.flows.commands import main
from draftwheel.hashing import file_sha256, weights_sha256
from draftwheel.registry_names import (CHAMPION_URI, DRAFT_KIND_TAG, DRAFT_MODEL, FILES_DIR, FILES_TAG, MEDUSA_MODEL,
                                       PREDICT_INPUTS, PREDICT_OUTPUTS, PYFUNC_LOADER, TARGET_SHA_TAG, WEIGHTS_TAG,
                                       version_uri)
from draftwheel.serving.draft_pyfunc import TargetNotFoundError
from draftwheel.serving.engine.eagle import Eagle3Config, Eagle3Draft, save_eagle3, vocab_from_counts
from draftwheel.serving.engine.engine import Engine
from draftwheel.serving.engine.medusa import MedusaHeads
from draftwheel.serving.engine.models import IncompatibleModelsError
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.loading import engine_from_specs, load_model, resolve_spec, target_tags
from draftwheel.serving.server.reload import DraftWatcher
from draftwheel.serving.testing import build_tokenizer, save_model, tiny_llama, zero_extended_target
from tests.conftest import make_champion

K = 3
PROMPTS = ["def add(a, b):", "The quick brown fox", "class Stack:", "Please write a short poem"]


def random_eagle3(target, sha: str, seed: int = 0) -> Eagle3Draft:
    """An untrained eagle3 draft for `target`: random weights, a draft vocabulary of half the target's."""
    torch.manual_seed(seed)
    config = Eagle3Config.for_target(target.config, draft_vocab_size=target.config.vocab_size // 2,
                                     target_sha256=sha)
    d2t, t2d = vocab_from_counts(torch.randint(0, 100, (target.config.vocab_size,)), config.draft_vocab_size)
    return Eagle3Draft(config, d2t=d2t, t2d=t2d).eval()


def random_heads(target, sha: str, seed: int = 0) -> MedusaHeads:
    """Medusa heads whose blocks are random (fresh heads are the identity: every head would repeat the target)."""
    torch.manual_seed(seed)
    heads = MedusaHeads.for_target(target, n_heads=K, target_sha256=sha)
    with torch.no_grad():
        for param in heads.blocks.parameters():
            param.normal_(0.0, 0.5)
    return heads


@pytest.fixture(scope="module")
def world(module_home, tmp_path_factory):
    """Model dirs, and one registered version of each kind, each recording the target's place."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = build_tokenizer()
    lm = tiny_llama(tokenizer, n_layers=1, hidden=64, seed=1, tie_embeddings=False)
    target = zero_extended_target(lm, 2)  # accepts every token the lm draft proposes; the random eagle3 and
    dirs = {"target": save_model(target, tokenizer, root / "target"),  # Medusa drafts are mostly rejected
            "other": save_model(tiny_llama(tokenizer, n_layers=2, hidden=64, seed=5, tie_embeddings=False),
                                tokenizer, root / "other"),
            "lm": save_model(lm, tokenizer, root / "lm")}
    sha = weights_sha256(dirs["target"])
    dirs["eagle3"] = save_eagle3(random_eagle3(target, sha), root / "eagle3", tokenizer)
    dirs["medusa"] = random_heads(target, sha).save(root / "medusa")
    recorded = target_tags(dirs["target"], sha)
    versions = {kind: registry.register_version(dirs[kind], kind, recorded) for kind in ("lm", "eagle3", "medusa")}
    tracking.setup_mlflow()  # mlflow.pyfunc.load_model reads the state dir's registry
    return {"dirs": dirs, "sha": sha, "versions": versions}


def engine_steps(engine: Engine, prompt: str, mode: str) -> list[tuple[list[int], list[int]]]:
    """(context, drafted tokens) of every step of a greedy request that drafted K tokens: the context is the
    prompt and every token emitted before the step (none when the target ends the request at once)."""
    completion, = engine.generate([prompt], SamplingParams(max_new_tokens=16, k=K), mode=mode)
    emitted = completion.token_ids
    # the prefill emits the first token: an lm draft's loop records it as a step of k = 0, the others do not
    done = 0 if mode == "draft" and engine.draft.kind == "lm" else 1
    steps = []
    for step in completion.record.steps:
        if step.k == K:
            steps.append((completion.prompt_token_ids + emitted[:done], step.draft_token_ids))
        done += step.accepted + 1
    return steps


def test_a_version_is_an_mlflow_model_around_the_files_serving_loads(world):
    version = world["versions"]["lm"]
    model_dir = Path(mlflow.artifacts.download_artifacts(version_uri(version), dst_path=tempfile.mkdtemp()))
    model = mlflow.models.Model.load(model_dir)
    flavor = model.flavors["python_function"]
    assert flavor["loader_module"] == PYFUNC_LOADER and flavor["data"] == FILES_DIR
    assert [c.name for c in model.signature.inputs.inputs] == [name for name, _ in PREDICT_INPUTS]
    assert [c.name for c in model.signature.outputs.inputs] == [name for name, _ in PREDICT_OUTPUTS]
    assert json.loads((model_dir / model.saved_input_example_info["artifact_path"]).read_text())
    requirements = (model_dir / "requirements.txt").read_text().split()
    assert any(r.startswith("draftwheel==") for r in requirements) and any(r.startswith("torch==") for r in requirements)
    assert model.metadata["draft_kind"] == "lm"
    # The data is exactly the files serving loads, and serving resolves exactly those, as before.
    tags = tracking.get_version_tags(version)
    files = json.loads(tags[FILES_TAG])
    assert sorted(p.name for p in (model_dir / FILES_DIR).iterdir()) == sorted(files)
    local, _, _ = tracking.resolve_model_uri(version_uri(version))
    assert sorted(p.name for p in local.iterdir()) == sorted(files)
    assert {name: file_sha256(local / name) for name in files} == files
    assert load_model(version_uri(version)).model_id.sha256 == tags[WEIGHTS_TAG]


@pytest.mark.parametrize("kind", ["lm", "eagle3"])
def test_champion_loads_as_pyfunc_and_proposes_what_the_engine_drafts(world, kind):
    registry.promote(world["versions"][kind], target_sha=world["sha"])
    model = mlflow.pyfunc.load_model(CHAMPION_URI)
    engine = engine_from_specs(world["dirs"]["target"], CHAMPION_URI)
    assert engine.draft.kind == kind
    compared = 0
    for prompt in PROMPTS:
        for context, drafted in engine_steps(engine, prompt, "draft"):
            got = model.predict([{"token_ids": context, "k": K}])
            assert list(got["token_ids"][0]) == drafted, (prompt, context)
            assert got["text"][0] == engine.target.tokenizer.decode(drafted)
            compared += 1
    assert compared >= 2 * len(PROMPTS)
    # A prompt is tokenised as serving tokenises a completion request; several rows in one call.
    prompt_ids = [engine.encode(p, chat=False)[1] for p in PROMPTS[:2]]
    by_prompt = model.predict([{"prompt": p, "k": K} for p in PROMPTS[:2]])
    by_ids = model.predict([{"token_ids": ids, "k": K} for ids in prompt_ids])
    assert [list(t) for t in by_prompt["token_ids"]] == [list(t) for t in by_ids["token_ids"]]


def test_medusa_heads_load_as_pyfunc_and_propose_what_the_engine_drafts(world):
    uri = version_uri(world["versions"]["medusa"], MEDUSA_MODEL)
    model = mlflow.pyfunc.load_model(uri)
    engine = engine_from_specs(world["dirs"]["target"], None, resolve_spec(uri))
    compared = 0
    for prompt in PROMPTS:
        for context, drafted in engine_steps(engine, prompt, "medusa"):
            assert list(model.predict([{"token_ids": context, "k": K}])["token_ids"][0]) == drafted
            compared += 1
    assert compared >= 2 * len(PROMPTS)
    assert len(model.predict([{"prompt": PROMPTS[0], "k": K + 2}])["token_ids"][0]) == K  # one per head


def test_the_target_is_checked_and_can_be_given(world, tmp_path):
    eagle = version_uri(world["versions"]["eagle3"])
    with pytest.raises(IncompatibleModelsError, match="trained for"):
        mlflow.pyfunc.load_model(eagle, model_config={"target": str(world["dirs"]["other"])})
    # A version that records no place for its target: an eagle3 draft needs one given, an lm draft proposes alone.
    bare = {TARGET_SHA_TAG: world["sha"]}
    eagle_bare = version_uri(registry.register_version(world["dirs"]["eagle3"], "eagle3", bare))
    with pytest.raises(TargetNotFoundError, match="model_config"):
        mlflow.pyfunc.load_model(eagle_bare)
    given = mlflow.pyfunc.load_model(eagle_bare, model_config={"target": str(world["dirs"]["target"])})
    recorded = mlflow.pyfunc.load_model(eagle)
    rows = [{"prompt": p, "k": K} for p in PROMPTS]
    assert given.predict(rows)["token_ids"].map(list).tolist() == recorded.predict(rows)["token_ids"].map(list).tolist()
    alone = mlflow.pyfunc.load_model(version_uri(registry.register_version(world["dirs"]["lm"], "lm", bare)))
    with_target = mlflow.pyfunc.load_model(version_uri(world["versions"]["lm"]))
    assert alone.predict(rows)["token_ids"].map(list).tolist() == \
        with_target.predict(rows)["token_ids"].map(list).tolist()
    # The recorded target moved away: said, with how to give it.
    moved = tmp_path / "moved-target"
    shutil.copytree(world["dirs"]["target"], moved)
    gone = version_uri(registry.register_version(world["dirs"]["eagle3"], "eagle3", target_tags(moved, world["sha"])))
    shutil.rmtree(moved)
    with pytest.raises(TargetNotFoundError, match="is gone.*model_config"):
        mlflow.pyfunc.load_model(gone)


def test_predict_names_what_is_wrong_with_a_row(world):
    model = mlflow.pyfunc.load_model(version_uri(world["versions"]["eagle3"]))
    with pytest.raises(ValueError, match="prompt.*token_ids"):
        model.predict([{"k": 2}])
    with pytest.raises(ValueError, match="k: must be at least 1"):
        model.predict([{"prompt": PROMPTS[0], "k": 0}])
    with pytest.raises(ValueError, match="token_ids: the context needs at least 2 tokens"):
        model.predict([{"token_ids": [5], "k": 2}])
    default_k = model.predict([{"prompt": PROMPTS[0]}])  # k defaults to serving's
    assert len(default_k["token_ids"][0]) == SamplingParams().k


def register_as_before(model_dir: Path, tags: dict[str, str], name: str = DRAFT_MODEL) -> str:
    """A version as draftwheel registered drafts before they were MLflow models: the safetensors and JSON
    files of the dir as a run's `model` artifacts, nothing else, with the hash tags."""
    client = MlflowClient()
    files = {p.name: file_sha256(p) for p in sorted(model_dir.iterdir()) if p.suffix in (".safetensors", ".json")}
    experiment = client.get_experiment_by_name(tracking.EXPERIMENT).experiment_id
    run = client.create_run(experiment, run_name=f"register-{name}")
    with tempfile.TemporaryDirectory() as staging:
        for file in files:
            shutil.copy2(model_dir / file, Path(staging) / file)
        client.log_artifacts(run.info.run_id, staging, "model")
    client.set_terminated(run.info.run_id)
    version = client.create_model_version(name, f"{run.info.artifact_uri}/model", run_id=run.info.run_id, tags={
        FILES_TAG: json.dumps(files, sort_keys=True), WEIGHTS_TAG: weights_sha256(model_dir), **tags})
    return str(version.version)


def test_versions_registered_before_drafts_were_mlflow_models_keep_working(world, tmp_path, capsys):
    old = register_as_before(world["dirs"]["eagle3"], {TARGET_SHA_TAG: world["sha"], DRAFT_KIND_TAG: "eagle3"})
    source = next(r["source"] for r in tracking.list_versions() if r["version"] == old)
    assert not any(p.name == "MLmodel" for p in Path(source.removeprefix("file://")).iterdir())
    local, _, _ = tracking.resolve_model_uri(version_uri(old))
    assert sorted(p.name for p in local.iterdir()) == sorted(json.loads(tracking.get_version_tags(old)[FILES_TAG]))
    # Promoted and served; a newer (MLflow model) version hot-reloads over it, and a rollback returns to it.
    new = world["versions"]["lm"]
    make_champion(new)
    registry.promote(old, target_sha=world["sha"])
    engine = engine_from_specs(world["dirs"]["target"], CHAMPION_URI)
    watcher = DraftWatcher(engine, CHAMPION_URI)
    assert not watcher.poll_once() and watcher.current_version == old and engine.draft.kind == "eagle3"
    assert engine.generate([PROMPTS[0]], SamplingParams(max_new_tokens=8, k=K), mode="draft")[0].token_ids
    registry.promote(new, target_sha=world["sha"])
    assert watcher.poll_once() and watcher.current_version == new and engine.draft.kind == "lm"
    assert registry.rollback() == {"champion": old, "previous": new}
    assert watcher.poll_once() and watcher.current_version == old and watcher.last_error is None
    assert {r["version"]: r["state"] for r in registry.status_rows() if r["model"] == DRAFT_MODEL}[old] == "ok"
    out = tmp_path / "exported"
    assert main(["export", "--uri", CHAMPION_URI, "--format", "speculators", "--out", str(out),
                 "--target", str(world["dirs"]["target"]), "--verifier", "org/tiny-target"]) == 0
    assert json.loads((out / "config.json").read_text())["speculators_config"]["verifier"]["name_or_path"] == \
        "org/tiny-target"
    # Such a version has no MLmodel: the pyfunc loader cannot load it (serving never needed one).
    with pytest.raises(MlflowException):
        mlflow.pyfunc.load_model(version_uri(old))
    # Its files gone: status says so, as for any version.
    shutil.rmtree(Path(source.removeprefix("file://")))
    assert {r["version"]: r["state"] for r in registry.status_rows() if r["model"] == DRAFT_MODEL}[old] == \
        "FILES MISSING"
