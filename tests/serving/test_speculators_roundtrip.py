"""`draftwheel export` read back by the speculators library's own EAGLE-3 classes (slow).

speculators 0.9.0 pins other transformers versions than draftwheel, so it runs in its own venv, made once
by `scripts/speculators_env.sh` (a minute or two and the package registry the first time; the test fails
naming the reason when it cannot be made). `scripts/speculators_check.py` runs there: it builds
`Eagle3DraftModel` from `Eagle3SpeculatorConfig`, loads the export's weights, and runs one draft step on
target hidden states we give it. It also loads the dir through `Eagle3DraftModel.from_pretrained`, which
resolves the verifier by its hub id: offline, from a hub cache laid out in the test.

Expected: no missing and no unexpected keys (apart from the two training-only tensors speculators never
saves itself), the embedding table present, and next-token logits equal to our draft's on the same
inputs up to float32 rounding (the two implementations order the same operations differently; observed
differences are ~1e-7 on logits of order 1). Argmax must agree wherever the top two logits are further
apart than that difference. Control: the stored draft, which shares the target's table and does not
carry it, loads with `embed_tokens.weight` missing: the check can see the failure it guards against.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from draftwheel.serving.engine.eagle import DraftKV, Eagle3Config, Eagle3Draft, save_eagle3, vocab_from_counts
from draftwheel.serving.testing import build_tokenizer, save_model, tiny_llama

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
VERIFIER = "draftwheel-test/tiny-llama"
NOT_SAVED = {"verifier_lm_head.weight", "verifier_norm.weight"}  # speculators' training-only copies


@pytest.fixture(scope="module")
def speculators_python() -> str:
    """The speculators venv's python (made by scripts/speculators_env.sh if it is not there yet)."""
    made = subprocess.run(["bash", str(ROOT / "scripts" / "speculators_env.sh")], capture_output=True, text=True,
                          timeout=1800)
    if made.returncode != 0:
        pytest.fail(f"scripts/speculators_env.sh could not make the speculators venv (exit {made.returncode}): "
                    + "\n".join(made.stderr.strip().splitlines()[-15:]))
    return made.stdout.strip().splitlines()[-1]


def hub_cache(root: Path, repo_id: str, model_dir: Path) -> Path:
    """A huggingface_hub cache holding `model_dir` as `repo_id`'s main revision (read with HF_HUB_OFFLINE=1)."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    revision = "0" * 40
    shutil.copytree(model_dir, repo / "snapshots" / revision)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return root


def check(python: str, export: Path, tmp: Path, *args: str) -> dict:
    env = {**os.environ, "HF_HUB_CACHE": str(tmp / "hub"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([python, str(ROOT / "scripts" / "speculators_check.py"), str(export), *args],
                          capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_speculators_loads_the_export_and_its_logits_match_ours(speculators_python, tmp_path):
    from draftwheel.flows.commands import main

    tokenizer = build_tokenizer()
    target = tiny_llama(tokenizer, n_layers=4, seed=0, tie_embeddings=True)  # tied, as SmolLM2's
    target_dir = save_model(target, tokenizer, tmp_path / "target")
    hub_cache(tmp_path / "hub", VERIFIER, target_dir)
    config = Eagle3Config.for_target(target.config, draft_vocab_size=target.config.vocab_size // 2)
    d2t, t2d = vocab_from_counts(torch.rand(target.config.vocab_size, generator=torch.Generator().manual_seed(0)),
                                 config.draft_vocab_size)
    torch.manual_seed(1)
    draft = Eagle3Draft(config, d2t=d2t, t2d=t2d).eval()
    stored = save_eagle3(draft, tmp_path / "stored", tokenizer)
    out = tmp_path / "export"
    assert main(["export", "--uri", str(stored), "--target", str(target_dir), "--verifier", VERIFIER,
                 "--out", str(out)]) == 0

    # Target hidden states for 16 positions; slot j reads the features at j and the token at j+1.
    ids = torch.randint(0, target.config.vocab_size, (1, 17), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        states = target(input_ids=ids, output_hidden_states=True).hidden_states
    aux = torch.cat([states[i] for i in config.aux_layer_ids], -1)[:, :16]  # [1, 16, 3H]
    tokens = ids[0, 1:]  # [16]
    draft.attach_target(target)
    with torch.inference_mode():
        ours = draft.logits(draft.extend(tokens, draft.project(aux[0]), DraftKV()))  # [16, Vd]
    save_file({"hidden_states": aux.contiguous(), "input_ids": tokens[None].contiguous()}, str(tmp_path / "in.st"))

    report = check(speculators_python, out, tmp_path, "--inputs", str(tmp_path / "in.st"),
                   "--logits", str(tmp_path / "theirs.st"), "--from-pretrained")
    assert report["missing"] == [] and report["unexpected"] == [], report
    assert set(report["not_saved"]) <= NOT_SAVED
    assert report["verifier"] == VERIFIER and report["embed_tokens_finite"] and report["embed_tokens_nonzero"]
    assert report["from_pretrained"] == {"aux_layer_ids": config.aux_layer_ids, "embed_tokens_equal": True}
    theirs = load_file(str(tmp_path / "theirs.st"))["logits"]
    assert theirs.shape == ours.shape
    diff = float((theirs - ours).abs().max())
    assert diff < 1e-4, diff
    top2 = ours.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) > 2 * diff  # positions whose argmax rounding cannot flip
    assert clear.sum() >= 12
    assert torch.equal(theirs.argmax(-1)[clear], ours.argmax(-1)[clear])
    print(f"speculators round trip: max |logit diff| {diff:.2e}, argmax agreement "
          f"{int((theirs.argmax(-1) == ours.argmax(-1)).sum())}/{ours.shape[0]}")

    control = check(speculators_python, stored, tmp_path)
    assert control["missing"] == ["embed_tokens.weight"] and not control["embed_tokens_finite"], control
