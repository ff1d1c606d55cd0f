"""Hot reload of the draft from the registry (draftwheel.serving.server.reload.DraftWatcher) with toy models.

Drafts (see tests/evaluation/test_shadow.build_toy_models): "good" proposes exactly the target's greedy
tokens, "bad" always proposes a different token. Each record's steps list the tokens its draft
proposed, so re-running the draft named in the record's `draft_id` over the same prefixes proves the
whole request was drafted by that one version: a request that switched drafts midway would fail it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
import torch

from draftwheel import tracking
from draftwheel.flows.commands import main
from draftwheel.registry import PromotionRefused, promote, register_version
from draftwheel.serving.loading import engine_from_specs
from draftwheel.serving.engine.models import IncompatibleModelsError, weights_sha256
from draftwheel.serving.loading import load_model
from draftwheel.serving.engine.params import SamplingParams
from draftwheel.serving.server.reload import DraftWatcher
from tests.conftest import make_champion
from tests.evaluation.test_shadow import build_toy_models

URI = f"models:/{tracking.DRAFT_MODEL}@champion"
PARAMS = SamplingParams(max_new_tokens=12, k=3)


@pytest.fixture(scope="module")
def registry(module_home, tmp_path_factory):
    """Registry with v(good), v(bad) for the toy target, a wrong-target version and a corrupt one."""
    paths = build_toy_models(tmp_path_factory.mktemp("toy"))
    target_sha = weights_sha256(paths["target"])
    versions = {name: tracking.register_draft(paths[name], {"target_sha256": target_sha})
                for name in ("good", "bad")}
    versions["wrong_target"] = tracking.register_draft(paths["good"], {"target_sha256": "0" * 64})
    versions["corrupt"] = tracking.register_draft(paths["good"], {"target_sha256": target_sha})
    row = next(r for r in tracking.list_versions() if r["version"] == versions["corrupt"])
    (Path(tracking.files_uri(row["source"], row["tags"]).removeprefix("file://")) / "model.safetensors").write_bytes(
        b"truncated")
    make_champion(versions["good"])
    return {"paths": paths, "versions": versions}


@pytest.fixture
def engine(registry):
    make_champion(registry["versions"]["good"])
    return engine_from_specs(registry["paths"]["target"], URI)


def draft_proposals(model, prefix: list[int], k: int) -> list[int]:
    """The k tokens a greedy draft proposes after `prefix` (full forward each time, no cache)."""
    ids = list(prefix)
    with torch.no_grad():
        for _ in range(k):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prefix):]


def drafted_by(record, model) -> bool:
    """True if every step's proposals are exactly what `model` proposes from that step's prefix."""
    prefix, produced = list(record.prompt_token_ids), 0
    for step in record.steps:
        context = prefix + record.output_token_ids[:produced]
        if draft_proposals(model, context, step.k) != step.draft_token_ids:
            return False
        produced += step.accepted + 1
    return True


def test_hot_reload_under_concurrent_requests(registry, engine):
    versions = registry["versions"]
    records, errors, stop = [], [], threading.Event()

    def client(worker: int) -> None:
        i = 0
        while not stop.is_set():
            try:
                records.append(engine.generate([f"def f{worker}_{i}(x):"], PARAMS)[0].record)
            except Exception as exc:  # noqa: BLE001 - collected and asserted below
                errors.append(exc)
            i += 1

    def wait_for(predicate, what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            time.sleep(0.02)

    threads = [threading.Thread(target=client, args=(w,)) for w in range(2)]
    with DraftWatcher(engine, URI, poll_s=0.05) as watcher:
        for thread in threads:
            thread.start()
        for name in ("bad", "good"):  # promote the bad draft, then roll forward to the good one again
            done = len(records)
            wait_for(lambda: len(records) >= done + 3, "requests on the current draft")
            make_champion(versions[name])
            wait_for(lambda: watcher.current_version == versions[name], f"swap to {name}")
        done = len(records)
        wait_for(lambda: len(records) >= done + 3, "requests after the last swap")
        stop.set()
        for thread in threads:
            thread.join()
    assert errors == []
    assert watcher.swaps == 2 and watcher.last_error is None
    by_version = {versions[n]: load_model(registry["paths"][n]).model for n in ("good", "bad")}
    shas = {versions[n]: tracking.get_version_tags(versions[n])[tracking.WEIGHTS_TAG] for n in ("good", "bad")}
    assert shas[versions["good"]] == weights_sha256(registry["paths"]["good"])
    assert {r.draft_id.version for r in records} == set(by_version)
    for record in records:
        assert record.draft_id.name == tracking.DRAFT_MODEL
        assert record.draft_id.sha256 == shas[record.draft_id.version]
        assert drafted_by(record, by_version[record.draft_id.version]), record.request_id
    # The check can tell the drafts apart: the bad draft's records are not the good draft's work.
    bad_records = [r for r in records if r.draft_id.version == versions["bad"]]
    assert not any(drafted_by(r, by_version[versions["good"]]) for r in bad_records)


def test_wrong_target_draft_is_refused(registry, engine):
    versions = registry["versions"]
    watcher = DraftWatcher(engine, URI)
    make_champion(versions["wrong_target"])
    assert not watcher.poll_once()
    assert "trained for target 000000000000" in watcher.last_error
    assert engine.draft.model_id.version == watcher.current_version == versions["good"]
    assert versions["wrong_target"] in watcher.refused
    # The old champion keeps serving.
    assert engine.generate(["def f(x):"], PARAMS)[0].record.draft_id.version == versions["good"]


def test_corrupt_artifact_is_refused(registry, engine):
    versions = registry["versions"]
    watcher = DraftWatcher(engine, URI)
    make_champion(versions["corrupt"])
    assert not watcher.poll_once()
    assert "ArtifactError" in watcher.last_error and "corrupt" in watcher.last_error
    assert engine.draft.model_id.version == versions["good"]
    # Refused versions are not fetched again while the alias stays on them.
    assert not watcher.poll_once() and list(watcher.refused) == [versions["corrupt"]]
    # Once the alias moves back, the refusal is forgotten and the watcher is healthy again.
    make_champion(versions["good"])
    assert not watcher.poll_once() and watcher.refused == {} and watcher.last_error is None


def test_unreachable_registry_keeps_the_draft(registry, engine, monkeypatch):
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    watcher = DraftWatcher(engine, URI, tracking_uri="http://127.0.0.1:9")
    assert not watcher.poll_once()
    assert "registry unreachable" in watcher.last_error
    assert watcher.refused == {}  # transient: retried at the next poll
    assert engine.generate(["def f(x):"], PARAMS)[0].record.draft_id.version == registry["versions"]["good"]


def test_watcher_needs_an_alias(engine):
    with pytest.raises(ValueError, match="alias"):
        DraftWatcher(engine, f"models:/{tracking.DRAFT_MODEL}/1")


def test_a_version_without_the_target_tag_is_refused_by_promote_serve_and_reload(registry, engine, tmp_path, capsys):
    """A version that does not say which target it was trained for (possible only through the bare MLflow
    primitive: `register_version` refuses it) is refused alike by the checked promote, by serve's
    compatibility check and by the hot-reload watcher, each naming the missing tag (`trained_for`)."""
    good = registry["versions"]["good"]
    with pytest.raises(ValueError, match="target_sha256"):
        register_version(registry["paths"]["good"], "lm", {})
    untagged = tracking.register_draft(registry["paths"]["good"], {})
    with pytest.raises(PromotionRefused, match="no target_sha256 tag"):
        promote(untagged)
    assert tracking.get_alias_version("champion") == good
    uri = f"models:/{tracking.DRAFT_MODEL}/{untagged}"
    with pytest.raises(IncompatibleModelsError, match="no target_sha256 tag"):
        engine.swap_draft(load_model(uri))
    capsys.readouterr()
    assert main(["serve", "--target", str(registry["paths"]["target"]), "--draft", uri,
                 "--log-dir", str(tmp_path / "logs")]) == 2
    assert "no target_sha256 tag" in capsys.readouterr().err
    watcher = DraftWatcher(engine, URI)
    make_champion(untagged)
    try:
        assert not watcher.poll_once() and "no target_sha256 tag" in watcher.last_error
        assert engine.draft.model_id.version == watcher.current_version == good
    finally:
        make_champion(good)
